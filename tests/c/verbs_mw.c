/*
 * Memory windows and invalidation through libibverbs, checked against what rxe answers
 * (rxe_mw.c, rxe_req.c, rxe_resp.c; rdma-core providers/rxe). Built and run by
 * tests/tests/verbs.rs with the drop-in library.
 *
 *   verbs_mw DEV GID_INDEX PORT             server: owns the region, binds the windows
 *   verbs_mw DEV GID_INDEX PORT SERVER_IP   client: reaches the server's memory through them
 *
 * Every case prints "CASE <name> ok" or "CASE <name> FAIL <why>"; the exit status is the
 * number of failures. The out-of-band exchange is a TCP socket, as ibv_rc_pingpong's.
 *
 * QP i of the server is connected to QP i of the client. Windows on the server's region:
 *   W1 type 1 (ibv_bind_mw on QP 0) over [256, 768): WRITE/READ inside, WRITE across its end
 *   W2 type 2 (IBV_WR_BIND_MW on QP 1) over [1024, 1536): WRITE/READ, then LOCAL_INV
 *   W3 type 2 (QP 2) over [2048, 2560): WRITE, then the client's SEND_WITH_INV
 *   W4 type 2 (QP 3) over [3072, 3584): WRITE through QP 4 (not its QP), then through QP 3
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define NQP 7
#define REGION 4096
#define GUARD 4096
#define WLEN 512
#define N 64

struct hello {
	uint32_t qpn[NQP];
	uint32_t psn;
	union ibv_gid gid;
};

struct keys {
	uint64_t addr; /* the server's region */
	uint32_t w[4]; /* rkeys of W1..W4 */
};

static void step(int fd, char c)
{
	if (write(fd, &c, 1) != 1)
		exit(100);
}

static void await(int fd)
{
	char c;
	if (read(fd, &c, 1) != 1)
		exit(100);
}

/* The completion of wr_id within 10 seconds (others are skipped), or status -1. */
static int wait_id(struct ibv_cq *cq, uint64_t wr_id, struct ibv_wc *out)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;
	while (time(NULL) < end) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			return -2;
		if (n == 1 && wc.wr_id == wr_id) {
			if (out)
				*out = wc;
			return wc.status;
		}
	}
	return -1;
}

/* An RDMA WRITE or READ of N bytes at buf (lkey) to raddr/rkey, waited for. */
static int rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op, uint64_t id,
		void *buf, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = N, .lkey = lkey};
	struct ibv_send_wr wr = {
		.wr_id = id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	int r = ibv_post_send(qp, &wr, &bad);
	if (r)
		return -100 - r;
	return wait_id(cq, id, NULL);
}

/* Binds type 2 window mw with IBV_WR_BIND_MW on qp; the window's new key in *key. */
static int bind2(struct ibv_qp *qp, struct ibv_cq *cq, uint64_t id, struct ibv_mw *mw,
		 struct ibv_mr *mr, uint64_t addr, uint64_t len, unsigned access, uint32_t *key)
{
	struct ibv_send_wr wr = {
		.wr_id = id,
		.opcode = IBV_WR_BIND_MW,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info.mr = mr;
	wr.bind_mw.bind_info.addr = addr;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	int r = ibv_post_send(qp, &wr, &bad);
	if (r)
		return -100 - r;
	struct ibv_wc wc;
	int st = wait_id(cq, id, &wc);
	if (st == IBV_WC_SUCCESS && wc.opcode != IBV_WC_BIND_MW)
		return -3;
	if (st == IBV_WC_SUCCESS) {
		mw->rkey = wr.bind_mw.rkey;
		if (key)
			*key = mw->rkey;
	}
	return st;
}

static int bind1(struct ibv_qp *qp, struct ibv_cq *cq, uint64_t id, struct ibv_mw *mw,
		 struct ibv_mr *mr, uint64_t addr, uint64_t len, unsigned access)
{
	struct ibv_mw_bind b = {.wr_id = id, .send_flags = IBV_SEND_SIGNALED};
	b.bind_info.mr = mr;
	b.bind_info.addr = addr;
	b.bind_info.length = len;
	b.bind_info.mw_access_flags = access;
	int r = ibv_bind_mw(qp, mw, &b);
	if (r)
		return -100 - r;
	struct ibv_wc wc;
	int st = wait_id(cq, id, &wc);
	if (st == IBV_WC_SUCCESS && wc.opcode != IBV_WC_BIND_MW)
		return -3;
	return st;
}

static int local_inv(struct ibv_qp *qp, struct ibv_cq *cq, uint64_t id, uint32_t key)
{
	struct ibv_send_wr wr = {
		.wr_id = id,
		.opcode = IBV_WR_LOCAL_INV,
		.send_flags = IBV_SEND_SIGNALED,
		.invalidate_rkey = key,
	}, *bad;
	int r = ibv_post_send(qp, &wr, &bad);
	if (r)
		return -100 - r;
	struct ibv_wc wc;
	int st = wait_id(cq, id, &wc);
	if (st == IBV_WC_SUCCESS && wc.opcode != IBV_WC_LOCAL_INV)
		return -3;
	return st;
}

static int run_server(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq,
		      struct ibv_qp **qp, int fd)
{
	const unsigned RW = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_device_attr da;
	int r = ibv_query_device(ctx, &da);
	report("query_device_claims_memory_windows",
	       r == 0 && da.max_mw > 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
		       (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
	       "max_mw %ld flags %#lx", da.max_mw, da.device_cap_flags);

	/* The region and a guard page after it: nothing may touch what no window allows. */
	unsigned char *mem = aligned_alloc(4096, REGION + GUARD);
	memset(mem, 0x5a, REGION + GUARD);
	struct ibv_mr *mr = ibv_reg_mr(pd, mem, REGION, IBV_ACCESS_LOCAL_WRITE | RW |
							   IBV_ACCESS_MW_BIND);
	static unsigned char other[REGION];
	struct ibv_mr *nobind = ibv_reg_mr(pd, other, REGION, IBV_ACCESS_LOCAL_WRITE | RW);
	struct ibv_mw *w1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	struct ibv_mw *w[4] = {w1, ibv_alloc_mw(pd, IBV_MW_TYPE_2), ibv_alloc_mw(pd, IBV_MW_TYPE_2),
			       ibv_alloc_mw(pd, IBV_MW_TYPE_2)};
	report("alloc_mw_type_1_and_2", mr && nobind && w[0] && w[1] && w[2] && w[3] &&
		       w[0]->type == IBV_MW_TYPE_1 && w[1]->type == IBV_MW_TYPE_2,
	       "mr %ld w1 %ld", (long)(mr != NULL), (long)(w1 != NULL));
	if (!mr || !w[0] || !w[1] || !w[2] || !w[3])
		return 100;

	uint64_t base = (uintptr_t)mem;
	int st = bind1(qp[0], cq, 1, w[0], mr, base + 256, WLEN, RW);
	report("bind_mw_type_1_completes_as_bind_mw", st == IBV_WC_SUCCESS, "status %ld%ld", st,
	       0);
	uint32_t k2, k3, k4;
	int s2 = bind2(qp[1], cq, 2, w[1], mr, base + 1024, WLEN, RW, &k2);
	int s3 = bind2(qp[2], cq, 3, w[2], mr, base + 2048, WLEN, RW, &k3);
	int s4 = bind2(qp[3], cq, 4, w[3], mr, base + 3072, WLEN, RW, &k4);
	report("wr_bind_mw_type_2_completes_as_bind_mw",
	       s2 == IBV_WC_SUCCESS && s3 == IBV_WC_SUCCESS && s4 == IBV_WC_SUCCESS,
	       "statuses %ld %ld", s2, s3 * 100 + s4);

	/* A receive for the client's SEND with invalidate, outside the region. */
	static unsigned char rbuf[N];
	struct ibv_mr *rmr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge rsge = {.addr = (uintptr_t)rbuf, .length = N, .lkey = rmr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 50, .sg_list = &rsge, .num_sge = 1}, *rbad;
	ibv_post_recv(qp[2], &rwr, &rbad);

	struct keys keys = {.addr = base, .w = {w[0]->rkey, k2, k3, k4}};
	if (xfer(fd, &keys, NULL, sizeof(keys)))
		return 100;

	/* Phase 2 is the client's; then invalidate W2 locally and look at the SEND. */
	await(fd);
	struct ibv_wc wc;
	st = wait_id(cq, 50, &wc);
	report("send_with_inv_completes_with_the_invalidated_rkey",
	       st == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_WITH_INV) &&
		       wc.invalidated_rkey == k3,
	       "status %ld flags %ld", st, wc.wc_flags);
	st = local_inv(qp[1], cq, 5, k2);
	report("local_inv_of_type_2_window_completes_as_local_inv", st == IBV_WC_SUCCESS,
	       "status %ld%ld", st, 0);
	step(fd, 'i');
	await(fd);

	/* What the client wrote landed inside the windows, and nothing else changed. */
	int ok = 1, first = -1;
	for (int i = 0; i < REGION + GUARD; i++) {
		unsigned char want = 0x5a;
		if (i >= 256 && i < 256 + N)
			want = 0x11;
		else if (i >= 1024 && i < 1024 + N)
			want = 0x22;
		else if (i >= 2048 && i < 2048 + N)
			want = 0x33;
		else if (i >= 3072 && i < 3072 + N)
			want = 0x44;
		if (mem[i] != want && first < 0)
			first = i;
		ok &= mem[i] == want;
	}
	report("writes_land_inside_windows_and_nowhere_else", ok, "first wrong byte %ld (%#lx)",
	       first, first >= 0 ? mem[first] : 0);

	/* Local errors, as rxe gives them. */
	struct ibv_mw_bind zb = {.wr_id = 9, .send_flags = IBV_SEND_SIGNALED};
	zb.bind_info.mr = mr;
	zb.bind_info.addr = 0;
	zb.bind_info.length = 64;
	zb.bind_info.mw_access_flags = RW | IBV_ACCESS_ZERO_BASED;
	r = ibv_bind_mw(qp[5], w[0], &zb);
	report("zero_based_type_1_bind_is_einval", r == EINVAL, "returned %ld%ld", r, 0);
	r = ibv_dereg_mr(mr);
	report("dereg_mr_with_bound_windows_is_einval", r == EINVAL, "returned %ld%ld", r, 0);
	struct ibv_mw *w5 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	st = bind2(qp[5], cq, 10, w5, nobind, (uintptr_t)other, 64, RW, NULL);
	report("bind_to_region_without_mw_bind_is_mw_bind_err", st == IBV_WC_MW_BIND_ERR,
	       "status %ld%ld", st, 0);
	struct ibv_mw *w6 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	st = bind1(qp[6], cq, 11, w6, mr, base + REGION - 32, 64, RW);
	report("bind_past_the_region_is_mw_bind_err", st == IBV_WC_MW_BIND_ERR, "status %ld%ld",
	       st, 0);
	r = ibv_dealloc_mw(w[0]) | ibv_dealloc_mw(w[1]) | ibv_dealloc_mw(w[2]) |
	    ibv_dealloc_mw(w[3]) | ibv_dealloc_mw(w5) | ibv_dealloc_mw(w6);
	int r2 = ibv_dereg_mr(mr);
	report("dealloc_of_bound_windows_then_dereg_succeed", r == 0 && r2 == 0,
	       "returned %ld then %ld", r, r2);
	ibv_dereg_mr(nobind);
	ibv_dereg_mr(rmr);
	return failures;
}

static int run_client(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_qp **qp, int fd)
{
	struct keys k;
	if (xfer(fd, NULL, &k, sizeof(k)))
		return 100;
	static unsigned char src[N], dst[N];
	struct ibv_mr *lmr = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, sizeof(dst), IBV_ACCESS_LOCAL_WRITE);
	int st, st2;

	/* W1, type 1: inside, read back, then across its end. */
	memset(src, 0x11, N);
	st = rdma(qp[0], cq, IBV_WR_RDMA_WRITE, 1, src, lmr->lkey, k.addr + 256, k.w[0]);
	memset(dst, 0, N);
	st2 = rdma(qp[0], cq, IBV_WR_RDMA_READ, 2, dst, dmr->lkey, k.addr + 256, k.w[0]);
	report("type_1_window_write_and_read_inside",
	       st == IBV_WC_SUCCESS && st2 == IBV_WC_SUCCESS && !memcmp(src, dst, N),
	       "statuses %ld %ld", st, st2);
	memset(src, 0x99, N);
	st = rdma(qp[0], cq, IBV_WR_RDMA_WRITE, 3, src, lmr->lkey, k.addr + 256 + WLEN - 8,
		  k.w[0]);
	report("type_1_window_write_across_its_end_is_rem_access_err",
	       st == IBV_WC_REM_ACCESS_ERR, "status %ld%ld", st, 0);

	/* W2, type 2: inside, read back (invalidated later). */
	memset(src, 0x22, N);
	st = rdma(qp[1], cq, IBV_WR_RDMA_WRITE, 4, src, lmr->lkey, k.addr + 1024, k.w[1]);
	memset(dst, 0, N);
	st2 = rdma(qp[1], cq, IBV_WR_RDMA_READ, 5, dst, dmr->lkey, k.addr + 1024, k.w[1]);
	report("type_2_window_write_and_read_inside",
	       st == IBV_WC_SUCCESS && st2 == IBV_WC_SUCCESS && !memcmp(src, dst, N),
	       "statuses %ld %ld", st, st2);

	/* W3: inside, then SEND with invalidate of its rkey, then WRITE again. */
	memset(src, 0x33, N);
	st = rdma(qp[2], cq, IBV_WR_RDMA_WRITE, 6, src, lmr->lkey, k.addr + 2048, k.w[2]);
	struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 8, .lkey = lmr->lkey};
	struct ibv_send_wr wr = {
		.wr_id = 7,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_INV,
		.send_flags = IBV_SEND_SIGNALED,
		.invalidate_rkey = k.w[2],
	}, *bad;
	int r = ibv_post_send(qp[2], &wr, &bad);
	st2 = r ? -100 - r : wait_id(cq, 7, NULL);
	report("send_with_inv_of_type_2_window_succeeds", st == IBV_WC_SUCCESS && st2 == 0,
	       "statuses %ld %ld", st, st2);
	memset(src, 0x98, N);
	st = rdma(qp[2], cq, IBV_WR_RDMA_WRITE, 8, src, lmr->lkey, k.addr + 2048, k.w[2]);
	report("write_after_send_with_inv_is_rem_access_err", st == IBV_WC_REM_ACCESS_ERR,
	       "status %ld%ld", st, 0);

	/* W4 is bound to the server's QP 3: through QP 4 refused, through QP 3 allowed. */
	memset(src, 0x97, N);
	st = rdma(qp[4], cq, IBV_WR_RDMA_WRITE, 9, src, lmr->lkey, k.addr + 3072, k.w[3]);
	report("type_2_window_through_another_qp_is_rem_access_err", st == IBV_WC_REM_ACCESS_ERR,
	       "status %ld%ld", st, 0);
	memset(src, 0x44, N);
	st = rdma(qp[3], cq, IBV_WR_RDMA_WRITE, 10, src, lmr->lkey, k.addr + 3072, k.w[3]);
	report("type_2_window_through_its_qp_succeeds", st == IBV_WC_SUCCESS, "status %ld%ld", st,
	       0);

	/* The server invalidates W2 with LOCAL_INV; then it is refused. */
	step(fd, 'c');
	await(fd);
	memset(src, 0x96, N);
	st = rdma(qp[1], cq, IBV_WR_RDMA_WRITE, 11, src, lmr->lkey, k.addr + 1024, k.w[1]);
	report("write_after_local_inv_is_rem_access_err", st == IBV_WC_REM_ACCESS_ERR,
	       "status %ld%ld", st, 0);
	step(fd, 'd');
	return failures;
}

int main(int argc, char **argv)
{
	const char *server;
	int gidx;
	struct ibv_context *ctx = open_from_args(argc, argv, &server, &gidx);
	if (!ctx)
		return 100;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !cq) {
		perror("ibv_alloc_pd/ibv_create_cq");
		return 100;
	}
	struct ibv_qp *qp[NQP];
	struct hello me = {.psn = 0x4242}, them;
	ibv_query_gid(ctx, 1, gidx, &me.gid);
	for (int i = 0; i < NQP; i++) {
		qp[i] = rc_qp(pd, cq);
		if (!qp[i]) {
			perror("ibv_create_qp");
			return 100;
		}
		me.qpn[i] = qp[i]->qp_num;
	}
	int fd = tcp(server, atoi(argv[3]));
	if (fd < 0 || xfer(fd, &me, &them, sizeof(me))) {
		perror("exchange");
		return 100;
	}
	for (int i = 0; i < NQP; i++)
		if (connect_qp(qp[i], them.qpn[i], them.psn, &them.gid, gidx)) {
			perror("connect");
			return 100;
		}
	return server ? run_client(pd, cq, qp, fd) : run_server(ctx, pd, cq, qp, fd);
}
