/*
 * Bad use of libibverbs, as a program could commit it, checked against what rdma-core and
 * rxe answer: an errno from the verb, or an error completion, and never a write outside a
 * registered region. Built and run by tests/tests/verbs_misuse.rs with the drop-in library.
 *
 *   verbs_misuse DEV GID_INDEX PORT             server: registers the target regions, waits
 *   verbs_misuse DEV GID_INDEX PORT SERVER_IP   client: the local cases, then the remote ones
 *
 * Every case prints one line "CASE <name> ok" or "CASE <name> FAIL <why>"; the exit status
 * is the number of failures. The out-of-band exchange is a TCP socket, as ibv_rc_pingpong's.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define NQP 4
#define REGION 4096
#define GUARD 4096

struct peer {
	uint32_t qpn[NQP];
	uint32_t psn;
	union ibv_gid gid;
	uint64_t addr; /* the server's writable region */
	uint32_t rkey_rw;
	uint32_t rkey_ro; /* the same memory, registered without remote write */
};

static int exchange(int fd, const struct peer *mine, struct peer *theirs)
{
	if (write(fd, mine, sizeof(*mine)) != sizeof(*mine))
		return -1;
	size_t got = 0;
	while (got < sizeof(*theirs)) {
		ssize_t n = read(fd, (char *)theirs + got, sizeof(*theirs) - got);
		if (n <= 0)
			return -1;
		got += n;
	}
	return 0;
}

/* One completion within 10 seconds, or status -1. */
static int wait_wc(struct ibv_cq *cq, uint64_t *wr_id)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;
	while (time(NULL) < end) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			return -2;
		if (n == 1) {
			if (wr_id)
				*wr_id = wc.wr_id;
			return wc.status;
		}
	}
	return -1;
}

static int post(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, uint64_t laddr,
		uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

/* The cases that need no peer: each verb's errno for a bad argument or a bad state. */
static void local_cases(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_device_attr da;
	if (ibv_query_device(ctx, &da)) {
		report("query_device", 0, "errno %ld%ld", errno, 0);
		return;
	}
	static char buf[REGION];
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE);
	report("reg_mr_remote_write_without_local_write_is_einval", !mr && errno == EINVAL,
	       "mr %ld errno %ld", (long)(mr != NULL), errno);

	errno = 0;
	struct ibv_cq *big = ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0);
	report("create_cq_beyond_max_cqe_is_einval", !big && errno == EINVAL, "cq %ld errno %ld",
	       (long)(big != NULL), errno);

	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = da.max_qp_wr + 1, .max_recv_wr = 1, .max_send_sge = 1,
			.max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	report("create_qp_beyond_max_qp_wr_is_einval", !qp && errno == EINVAL, "qp %ld errno %ld",
	       (long)(qp != NULL), errno);

	qp = rc_qp(pd, cq);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS};
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	report("modify_qp_reset_to_rts_is_einval", r == EINVAL, "returned %ld%ld", r, 0);

	struct ibv_mr *ok = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	r = post(qp, IBV_WR_SEND, 1, (uintptr_t)buf, 8, ok->lkey, 0, 0);
	report("post_send_in_reset_is_einval", r == EINVAL, "returned %ld%ld", r, 0);

	/* Receives beyond the queue's depth: ENOMEM, as rxe's full queue. */
	struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 1};
	ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					 IBV_QP_ACCESS_FLAGS);
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	ibv_query_qp(qp, &qattr, IBV_QP_CAP, &qinit);
	r = 0;
	uint32_t posted = 0;
	for (; posted <= qattr.cap.max_recv_wr && r == 0; posted++) {
		struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = ok->lkey};
		struct ibv_recv_wr wr = {.wr_id = posted, .sg_list = &sge, .num_sge = 1}, *bad;
		r = ibv_post_recv(qp, &wr, &bad);
	}
	report("post_recv_beyond_max_recv_wr_is_enomem",
	       r == ENOMEM && posted == qattr.cap.max_recv_wr + 1, "returned %ld after %ld", r,
	       posted);

	r = ibv_dealloc_pd(pd);
	report("dealloc_pd_in_use_is_ebusy", r == EBUSY, "returned %ld%ld", r, 0);
	r = ibv_destroy_cq(cq);
	report("destroy_cq_in_use_is_ebusy", r == EBUSY, "returned %ld%ld", r, 0);

	ibv_destroy_qp(qp);
	ibv_dereg_mr(ok);
	ibv_destroy_cq(cq);
}

int main(int argc, char **argv)
{
	const char *server;
	int gidx;
	struct ibv_context *ctx = open_from_args(argc, argv, &server, &gidx);
	if (!ctx)
		return 100;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd) {
		perror("ibv_alloc_pd");
		return 100;
	}
	if (server)
		local_cases(ctx, pd);

	/* The region and a guard page after it, in one buffer: nothing may touch the guard. */
	unsigned char *mem = aligned_alloc(4096, REGION + GUARD);
	memset(mem, 0x5a, REGION + GUARD);
	struct ibv_mr *rw = ibv_reg_mr(pd, mem, REGION, IBV_ACCESS_LOCAL_WRITE |
							 IBV_ACCESS_REMOTE_WRITE |
							 IBV_ACCESS_REMOTE_READ);
	struct ibv_mr *ro = ibv_reg_mr(pd, mem, REGION, IBV_ACCESS_LOCAL_WRITE |
							 IBV_ACCESS_REMOTE_READ);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp *qp[NQP];
	struct peer me = {.psn = 0x123456, .addr = (uintptr_t)mem, .rkey_rw = rw->rkey,
			  .rkey_ro = ro->rkey},
		    them;
	ibv_query_gid(ctx, 1, gidx, &me.gid);
	for (int i = 0; i < NQP; i++) {
		qp[i] = rc_qp(pd, cq);
		me.qpn[i] = qp[i]->qp_num;
	}
	int fd = tcp(server, atoi(argv[3]));
	if (fd < 0 || exchange(fd, &me, &them)) {
		perror("exchange");
		return 100;
	}
	for (int i = 0; i < NQP; i++)
		if (connect_qp(qp[i], them.qpn[i], them.psn, &them.gid, gidx)) {
			perror("connect");
			return 100;
		}
	char done;
	if (!server) {
		/* Wait for the client's cases, then check that none wrote where it must not. */
		if (read(fd, &done, 1) != 1)
			return 100;
		int intact = 1;
		for (int i = 0; i < REGION + GUARD; i++)
			intact &= mem[i] == 0x5a;
		report("no_byte_written_by_refused_requests", intact, "first change at %ld%ld",
		       0, 0);
		for (int i = 0; i < REGION + GUARD; i++)
			if (mem[i] != 0x5a) {
				printf("byte %d is %#x\n", i, mem[i]);
				break;
			}
		return failures;
	}

	/* Not misuse, but what the cases below rely on: the QP reports what it was given. */
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	int r = ibv_query_qp(qp[0], &qa, IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN, &qi);
	report("query_qp_returns_what_modify_qp_set",
	       r == 0 && qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == them.qpn[0] &&
		       qa.path_mtu == IBV_MTU_1024 && qa.timeout == 14 && qa.retry_cnt == 7 &&
		       qa.rnr_retry == 7 && qa.sq_psn == them.psn && qa.rq_psn == them.psn &&
		       qa.max_dest_rd_atomic == 1 && qa.min_rnr_timer == 12 &&
		       qa.qp_access_flags ==
			       (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) &&
		       qa.ah_attr.is_global == 1 &&
		       !memcmp(&qa.ah_attr.grh.dgid, &them.gid, sizeof(them.gid)) &&
		       qi.qp_type == IBV_QPT_RC && qi.send_cq == cq,
	       "returned %ld, state %ld", r, qa.qp_state);

	static unsigned char src[2 * REGION];
	memset(src, 0xa5, sizeof(src));
	struct ibv_mr *lmr = ibv_reg_mr(pd, src, REGION, IBV_ACCESS_LOCAL_WRITE);
	uint64_t id;
	int st, st2;

	/* An lkey that names no region: the request completes with a local protection error,
	 * as rxe's requester finds it when it copies the payload; the next one is flushed. */
	post(qp[0], IBV_WR_SEND, 10, (uintptr_t)src, 64, lmr->lkey ^ 0xffff00, 0, 0);
	st = wait_wc(cq, &id);
	post(qp[0], IBV_WR_SEND, 11, (uintptr_t)src, 64, lmr->lkey, 0, 0);
	st2 = wait_wc(cq, NULL);
	report("unknown_lkey_completes_with_loc_prot_err_then_flush",
	       st == IBV_WC_LOC_PROT_ERR && st2 == IBV_WC_WR_FLUSH_ERR, "status %ld then %ld", st,
	       st2);

	/* A gather entry that runs past the end of its region. */
	post(qp[1], IBV_WR_RDMA_WRITE, 20, (uintptr_t)src + REGION - 16, 64, lmr->lkey,
	     them.addr, them.rkey_rw);
	st = wait_wc(cq, NULL);
	report("sge_past_its_region_completes_with_loc_prot_err", st == IBV_WC_LOC_PROT_ERR,
	       "status %ld%ld", st, 0);

	/* A WRITE with an rkey registered without remote write: the responder NAKs it. */
	post(qp[2], IBV_WR_RDMA_WRITE, 30, (uintptr_t)src, 64, lmr->lkey, them.addr,
	     them.rkey_ro);
	st = wait_wc(cq, NULL);
	report("write_without_remote_write_right_is_rem_access_err", st == IBV_WC_REM_ACCESS_ERR,
	       "status %ld%ld", st, 0);

	/* A WRITE that would run past the end of the remote region into the guard page. */
	post(qp[3], IBV_WR_RDMA_WRITE, 40, (uintptr_t)src, 64, lmr->lkey,
	     them.addr + REGION - 32, them.rkey_rw);
	st = wait_wc(cq, NULL);
	report("write_past_the_remote_region_is_rem_access_err", st == IBV_WC_REM_ACCESS_ERR,
	       "status %ld%ld", st, 0);

	done = 1;
	if (write(fd, &done, 1) != 1)
		return 100;
	return failures;
}
