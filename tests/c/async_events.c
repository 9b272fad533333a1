/* Asynchronous events through the libibverbs ABI (tests/tests/verbs.rs builds this against
 * libibverbs-dev's headers and runs it on the drop-in library with `roce exec`).
 *
 *   async_events GID_INDEX PORT            server: an RC QP on an SRQ of 8 WQEs armed at 4;
 *                                          receives 6 SENDs, then expects exactly one
 *                                          IBV_EVENT_SRQ_LIMIT_REACHED for its SRQ on
 *                                          async_fd (poll(2) + ibv_get_async_event), with
 *                                          ibv_query_srq reading the limit back as 0.
 *   async_events GID_INDEX PORT SERVER_IP  client: sends the 6 SENDs; when the server has
 *                                          destroyed its QP and said so, sends once more
 *                                          (retry_cnt 1) and expects a RETRY_EXC_ERR
 *                                          completion and IBV_EVENT_QP_FATAL for its QP.
 * Prints "OK ..." lines; exits 0 only if every check held. */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSGS 6
#define SIZE 64

static int fail(const char *what)
{
	fprintf(stderr, "FAIL %s\n", what);
	exit(1);
}

/* Waits up to ms for async_fd to become readable; returns whether it did. */
static int async_ready(struct ibv_context *ctx, int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

static int tcp(const char *server, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (server) {
		inet_pton(AF_INET, server, &a.sin_addr);
		for (int i = 0; i < 100; i++) {
			if (!connect(s, (struct sockaddr *)&a, sizeof a))
				return s;
			usleep(100000);
		}
		fail("connect");
	}
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1))
		fail("listen");
	int c = accept(s, NULL, NULL);
	close(s);
	return c;
}

struct dest {
	unsigned qpn, psn;
	union ibv_gid gid;
};

static void exchange(int sock, struct dest *me, struct dest *peer)
{
	char msg[80], hex[33];
	for (int i = 0; i < 16; i++)
		sprintf(hex + 2 * i, "%02x", me->gid.raw[i]);
	snprintf(msg, sizeof msg, "%06x %06x %s", me->qpn, me->psn, hex);
	if (write(sock, msg, sizeof msg) != sizeof msg)
		fail("write dest");
	size_t n = 0;
	while (n < sizeof msg) {
		ssize_t r = read(sock, msg + n, sizeof msg - n);
		if (r <= 0)
			fail("read dest");
		n += r;
	}
	if (sscanf(msg, "%x %x %32s", &peer->qpn, &peer->psn, hex) != 3)
		fail("parse dest");
	for (int i = 0; i < 16; i++)
		sscanf(hex + 2 * i, "%2hhx", &peer->gid.raw[i]);
}

static void connect_qp(struct ibv_qp *qp, struct dest *me, struct dest *peer, int gidx)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer->qpn,
		.rq_psn = peer->psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer->gid, .sgid_index = gidx, .hop_limit = 1 } },
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("RTR");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 8; /* 1 ms */
	a.retry_cnt = 1;
	a.rnr_retry = 7;
	a.sq_psn = me->psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fail("RTS");
}

static void wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 20000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			fail("poll_cq");
		if (n == 1)
			return;
		if (i > 1000)
			usleep(10);
	}
	fail("completion timeout");
}

int main(int argc, char **argv)
{
	if (argc < 3)
		fail("usage: async_events GID_INDEX PORT [SERVER_IP]");
	int gidx = atoi(argv[1]), port = atoi(argv[2]);
	const char *server = argc > 3 ? argv[3] : NULL;
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		fail("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		fail("open");
	if (ctx->async_fd < 0)
		fail("async_fd");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = calloc(1, 8 * SIZE);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, 8 * SIZE, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	if (!mr || !cq)
		fail("pd/mr/cq");
	struct ibv_srq *srq = NULL;
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_send_sge = 1,
						.max_recv_wr = 8, .max_recv_sge = 1 } };
	if (!server) {
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
		srq = ibv_create_srq(pd, &sa);
		if (!srq)
			fail("create_srq");
		qa.srq = srq;
	}
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	if (!qp)
		fail("create_qp");
	struct ibv_qp_attr ia = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	if (ibv_modify_qp(qp, &ia, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS))
		fail("INIT");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = SIZE, .lkey = mr->lkey };
	if (srq) {
		struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
		/* A QP on an SRQ has no receive queue of its own (rxe: EINVAL). */
		if (ibv_post_recv(qp, &wr, &bad) != EINVAL)
			fail("post_recv on an SRQ QP was not EINVAL");
		for (int i = 0; i < 8; i++) {
			wr.wr_id = 100 + i;
			if (ibv_post_srq_recv(srq, &wr, &bad))
				fail("post_srq_recv");
		}
		if (ibv_post_srq_recv(srq, &wr, &bad) != ENOMEM)
			fail("a ninth WQE was not ENOMEM");
		struct ibv_srq_attr arm = { .srq_limit = 4 };
		if (ibv_modify_srq(srq, &arm, IBV_SRQ_LIMIT))
			fail("modify_srq");
		struct ibv_srq_attr q;
		if (ibv_query_srq(srq, &q) || q.srq_limit != 4 || q.max_wr != 8)
			fail("query_srq armed");
		if (ibv_destroy_srq(srq) != EBUSY)
			fail("destroying a used SRQ was not EBUSY");
	}
	struct dest me = { .qpn = qp->qp_num, .psn = 0x1234 }, peer;
	if (ibv_query_gid(ctx, 1, gidx, &me.gid))
		fail("query_gid");
	int sock = tcp(server, port);
	exchange(sock, &me, &peer);
	connect_qp(qp, &me, &peer, gidx);
	if (write(sock, "R", 1) != 1)
		fail("sync");
	char c;
	if (read(sock, &c, 1) != 1)
		fail("sync");
	struct ibv_wc wc;
	if (srq) {
		for (int i = 0; i < MSGS; i++) {
			wait_wc(cq, &wc);
			if (wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)(100 + i) ||
			    wc.qp_num != qp->qp_num)
				fail("receive completion");
		}
		if (!async_ready(ctx, 5000))
			fail("async_fd did not become readable");
		struct ibv_async_event ev;
		if (ibv_get_async_event(ctx, &ev))
			fail("get_async_event");
		if (ev.event_type != IBV_EVENT_SRQ_LIMIT_REACHED || ev.element.srq != srq)
			fail("not the SRQ limit event");
		printf("OK %s\n", ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
		struct ibv_srq_attr q;
		if (ibv_query_srq(srq, &q) || q.srq_limit != 0)
			fail("the limit is still armed");
		while (async_ready(ctx, 200)) {
			if (ibv_get_async_event(ctx, &ev))
				fail("get_async_event");
			if (ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED)
				fail("a second limit event");
			ibv_ack_async_event(&ev);
		}
		printf("OK one limit event, limit disarmed\n");
		/* The peer vanishes: the QP goes, then the client is told. */
		if (ibv_destroy_qp(qp) || ibv_destroy_srq(srq))
			fail("destroy");
		if (write(sock, "D", 1) != 1)
			fail("sync");
		close(sock);
		return 0;
	}
	for (int i = 0; i < MSGS; i++) {
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bad;
		if (ibv_post_send(qp, &wr, &bad))
			fail("post_send");
		wait_wc(cq, &wc);
		if (wc.status != IBV_WC_SUCCESS)
			fail("send completion");
	}
	if (read(sock, &c, 1) != 1 || c != 'D')
		fail("the server did not finish");
	struct ibv_send_wr wr = { .wr_id = 99, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	if (ibv_post_send(qp, &wr, &bad))
		fail("post_send");
	wait_wc(cq, &wc);
	if (wc.status != IBV_WC_RETRY_EXC_ERR || wc.wr_id != 99)
		fail("no retry-exceeded completion");
	printf("OK %s\n", ibv_wc_status_str(wc.status));
	if (!async_ready(ctx, 5000))
		fail("async_fd did not become readable");
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		fail("get_async_event");
	while (ev.event_type == IBV_EVENT_COMM_EST) {
		ibv_ack_async_event(&ev);
		if (ibv_get_async_event(ctx, &ev))
			fail("get_async_event");
	}
	if (ev.event_type != IBV_EVENT_QP_FATAL || ev.element.qp != qp)
		fail("not QP fatal");
	printf("OK %s\n", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
