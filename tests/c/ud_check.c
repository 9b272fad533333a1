/* UD address handles and bad use on a libibverbs, written for tests/tests/verbs.rs, which
 * compiles it against rdma-core's headers and runs it on the drop-in library with `roce exec`.
 *
 *   ud_check misuse DEV GIDX PEER_GID UNREACHABLE_GID NOROUTE_GID
 *       Prints `name=value` lines: the errno of ibv_create_ah for an AV without a GRH, a
 *       multicast GID, a GID nobody answers ARP for, a GID without a route; what posting a UD
 *       SEND longer than the port MTU gives (post result, completion status); the errno of a
 *       UD post with an RDMA WRITE opcode and with a NULL AH; ibv_qp_to_qp_ex of a QP made
 *       by ibv_create_qp.
 *   ud_check echo DEV GIDX QPN_FILE
 *       Writes its QPN to QPN_FILE, waits for one datagram, answers it through an AH made by
 *       ibv_create_ah_from_wc from the datagram's GRH, and prints the sender's GID.
 *   ud_check ask DEV GIDX SERVER_GID QPN_FILE
 *       Sends "ping" to the echo's QPN, waits for the answer and checks it: payload, src_qp,
 *       IBV_WC_GRH, and ibv_init_ah_from_wc naming the echo's GID and our GID index.
 * GIDs are written as IPv6 addresses (IPv4-mapped for IPv4). Exit status 0 when every step
 * ran; the test checks the printed values. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define QKEY 0x11111111
#define BUF 4096

struct ud {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	int mtu;
	int gidx;
};

static void die(const char *what)
{
	fprintf(stderr, "ud_check: %s failed: %s\n", what, strerror(errno));
	exit(2);
}

static void setup(struct ud *u, const char *dev, int gidx)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_port_attr port;
	int i;

	if (!list)
		die("ibv_get_device_list");
	for (i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev))
			break;
	if (!list[i]) {
		fprintf(stderr, "ud_check: no device %s\n", dev);
		exit(2);
	}
	u->ctx = ibv_open_device(list[i]);
	if (!u->ctx)
		die("ibv_open_device");
	ibv_free_device_list(list);
	if (ibv_query_port(u->ctx, 1, &port))
		die("ibv_query_port");
	u->mtu = 1 << (port.active_mtu + 7);
	u->gidx = gidx;
	u->pd = ibv_alloc_pd(u->ctx);
	if (!u->pd)
		die("ibv_alloc_pd");
	u->buf = calloc(1, BUF + 40);
	u->mr = ibv_reg_mr(u->pd, u->buf, BUF + 40, IBV_ACCESS_LOCAL_WRITE);
	if (!u->mr)
		die("ibv_reg_mr");
	u->cq = ibv_create_cq(u->ctx, 16, NULL, NULL, 0);
	if (!u->cq)
		die("ibv_create_cq");
	struct ibv_qp_init_attr init = {
		.send_cq = u->cq,
		.recv_cq = u->cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	u->qp = ibv_create_qp(u->pd, &init);
	if (!u->qp)
		die("ibv_create_qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	if (ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					   IBV_QP_QKEY))
		die("modify to INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(u->qp, &a, IBV_QP_STATE))
		die("modify to RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("modify to RTS");
}

/* Releases everything, as programs do before they exit: closing the device lets the
 * engine send what is still queued. */
static void teardown(struct ud *u)
{
	if (ibv_destroy_qp(u->qp) || ibv_destroy_cq(u->cq) || ibv_dereg_mr(u->mr) ||
	    ibv_dealloc_pd(u->pd) || ibv_close_device(u->ctx))
		die("teardown");
	free(u->buf);
}

static union ibv_gid gid_of(const char *s)
{
	union ibv_gid g;

	if (inet_pton(AF_INET6, s, g.raw) != 1) {
		fprintf(stderr, "ud_check: bad GID %s\n", s);
		exit(2);
	}
	return g;
}

static struct ibv_ah *ah_to(struct ud *u, const char *gid)
{
	struct ibv_ah_attr a = {
		.is_global = 1,
		.port_num = 1,
		.grh = { .dgid = gid_of(gid), .sgid_index = u->gidx, .hop_limit = 64 },
	};
	return ibv_create_ah(u->pd, &a);
}

static int ah_errno(struct ud *u, const char *gid)
{
	struct ibv_ah *ah;

	errno = 0;
	ah = ah_to(u, gid);
	if (ah) {
		ibv_destroy_ah(ah);
		return 0;
	}
	return errno;
}

static int post_send(struct ud *u, struct ibv_ah *ah, uint32_t qpn, uint32_t len,
		     enum ibv_wr_opcode op)
{
	struct ibv_sge sge = { .addr = (uintptr_t)u->buf + 40, .length = len,
			       .lkey = u->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.ud = { .ah = ah, .remote_qpn = qpn, .remote_qkey = QKEY },
	}, *bad;
	return ibv_post_send(u->qp, &wr, &bad);
}

static void post_recv(struct ud *u)
{
	struct ibv_sge sge = { .addr = (uintptr_t)u->buf, .length = BUF + 40,
			       .lkey = u->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(u->qp, &wr, &bad))
		die("ibv_post_recv");
}

/* The next completion, waiting up to 10 s. */
static struct ibv_wc next_wc(struct ud *u)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;

	for (;;) {
		int n = ibv_poll_cq(u->cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1)
			return wc;
		if (time(NULL) > end) {
			fprintf(stderr, "ud_check: no completion in 10 s\n");
			exit(3);
		}
		usleep(100);
	}
}

static int misuse(char **argv)
{
	struct ud u;
	struct ibv_ah_attr local = { .is_global = 0, .port_num = 1, .dlid = 1 };
	struct ibv_ah *ah;
	struct ibv_wc wc;

	setup(&u, argv[2], atoi(argv[3]));
	errno = 0;
	ah = ibv_create_ah(u.pd, &local);
	printf("no_grh=%d\n", ah ? 0 : errno);
	printf("multicast=%d\n", ah_errno(&u, "::ffff:239.1.1.1"));
	printf("unreachable=%d\n", ah_errno(&u, argv[5]));
	printf("no_route=%d\n", ah_errno(&u, argv[6]));
	ah = ah_to(&u, argv[4]);
	if (!ah)
		die("ibv_create_ah to the peer");
	printf("mtu=%d\n", u.mtu);
	printf("oversized_post=%d\n", post_send(&u, ah, 0x123, u.mtu + 1, IBV_WR_SEND));
	wc = next_wc(&u);
	printf("oversized_status=%s\n", ibv_wc_status_str(wc.status));
	printf("write_post=%d\n", post_send(&u, ah, 0x123, 8, IBV_WR_RDMA_WRITE));
	printf("null_ah_post=%d\n", post_send(&u, NULL, 0x123, 8, IBV_WR_SEND));
	printf("qp_ex=%s\n", ibv_qp_to_qp_ex(u.qp) ? "yes" : "null");
	printf("destroy_ah=%d\n", ibv_destroy_ah(ah));
	teardown(&u);
	return 0;
}

static void gid_str(const union ibv_gid *g, char *out)
{
	inet_ntop(AF_INET6, g->raw, out, INET6_ADDRSTRLEN);
}

static int echo(char **argv)
{
	struct ud u;
	struct ibv_wc wc;
	struct ibv_ah *ah;
	struct ibv_ah_attr back;
	char s[INET6_ADDRSTRLEN];
	FILE *f;

	setup(&u, argv[2], atoi(argv[3]));
	post_recv(&u);
	f = fopen(argv[4], "w");
	if (!f || fprintf(f, "%u\n", u.qp->qp_num) < 0 || fclose(f))
		die("writing the QPN");
	wc = next_wc(&u);
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
		fprintf(stderr, "ud_check: receive %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	if (ibv_init_ah_from_wc(u.ctx, 1, &wc, (struct ibv_grh *)u.buf, &back))
		die("ibv_init_ah_from_wc");
	gid_str(&back.grh.dgid, s);
	printf("from=%s sgid_index=%d hop_limit=%d byte_len=%u grh=%d\n", s,
	       back.grh.sgid_index, back.grh.hop_limit, wc.byte_len,
	       !!(wc.wc_flags & IBV_WC_GRH));
	ah = ibv_create_ah_from_wc(u.pd, &wc, (struct ibv_grh *)u.buf, 1);
	if (!ah)
		die("ibv_create_ah_from_wc");
	memcpy(u.buf + 40, "pong", 4);
	if (post_send(&u, ah, wc.src_qp, 4, IBV_WR_SEND))
		die("ibv_post_send");
	wc = next_wc(&u);
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "ud_check: send %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	ibv_destroy_ah(ah);
	teardown(&u);
	return 0;
}

static int ask(char **argv)
{
	struct ud u;
	struct ibv_wc wc;
	struct ibv_ah *ah;
	struct ibv_ah_attr back;
	char s[INET6_ADDRSTRLEN];
	unsigned qpn = 0;
	FILE *f = NULL;
	int i;

	setup(&u, argv[2], atoi(argv[3]));
	for (i = 0; i < 100 && !(f = fopen(argv[5], "r")); i++)
		usleep(100000);
	if (!f || fscanf(f, "%u", &qpn) != 1)
		die("reading the QPN");
	fclose(f);
	post_recv(&u);
	ah = ah_to(&u, argv[4]);
	if (!ah)
		die("ibv_create_ah");
	memcpy(u.buf + 40, "ping", 4);
	if (post_send(&u, ah, qpn, 4, IBV_WR_SEND))
		die("ibv_post_send");
	for (i = 0; i < 2; i++) {
		wc = next_wc(&u);
		if (wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "ud_check: %s\n", ibv_wc_status_str(wc.status));
			return 1;
		}
		if (wc.opcode == IBV_WC_RECV)
			break;
	}
	if (wc.opcode != IBV_WC_RECV)
		wc = next_wc(&u);
	if (ibv_init_ah_from_wc(u.ctx, 1, &wc, (struct ibv_grh *)u.buf, &back))
		die("ibv_init_ah_from_wc");
	gid_str(&back.grh.dgid, s);
	printf("reply=%.4s src_qp_ok=%d from=%s sgid_index=%d grh=%d byte_len=%u\n",
	       u.buf + 40, wc.src_qp == qpn, s, back.grh.sgid_index,
	       !!(wc.wc_flags & IBV_WC_GRH), wc.byte_len);
	ibv_destroy_ah(ah);
	teardown(&u);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 7 && !strcmp(argv[1], "misuse"))
		return misuse(argv);
	if (argc == 5 && !strcmp(argv[1], "echo"))
		return echo(argv);
	if (argc == 6 && !strcmp(argv[1], "ask"))
		return ask(argv);
	fprintf(stderr, "usage: see the comment at the top of ud_check.c\n");
	return 2;
}
