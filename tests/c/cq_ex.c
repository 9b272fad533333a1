/* The extended CQ through libibverbs (ibv_create_cq_ex, ibv_start_poll/ibv_next_poll/
 * ibv_end_poll and the ibv_wc_read_* calls), checked case by case as rxe answers them:
 * tests/tests/verbs.rs compiles this against the installed headers and runs it on the
 * drop-in library (ip netns exec, LD_LIBRARY_PATH).
 *
 *   cq_ex DEVICE GID_INDEX PORT [SERVER_IPV4]
 *
 * Both ends put their RC QP on an extended CQ. The client sends a SEND with immediate data
 * (100 bytes) and a plain SEND (7 bytes) and reads its two send completions through the
 * extended interface; the server reads the two receives field by field, then a third message
 * through ibv_poll_cq on the same CQ (ibv_cq_ex_to_cq). Each check prints "CASE name ok" or
 * "CASE name FAIL ...". */
#include <stdlib.h>

#include "common.h"

#define IMM 0x12345678u

struct hello {
	uint32_t qpn;
	uint32_t psn;
	union ibv_gid gid;
};

/* Waits (up to ~10 s) for the next completion of the batch: ibv_start_poll when `first`,
 * else ibv_next_poll, retried (a new batch) while the CQ is empty. */
static int next_wc(struct ibv_cq_ex *cq, int *in_batch)
{
	for (int i = 0; i < 1000000; i++) {
		int r;
		if (*in_batch) {
			r = ibv_next_poll(cq);
			if (r == ENOENT) {
				ibv_end_poll(cq);
				*in_batch = 0;
				continue;
			}
		} else {
			struct ibv_poll_cq_attr attr = {};
			r = ibv_start_poll(cq, &attr);
			if (r == ENOENT) {
				usleep(10);
				continue;
			}
			if (r == 0)
				*in_batch = 1;
		}
		return r;
	}
	return ETIMEDOUT;
}

static struct ibv_cq_ex *make_cq(struct ibv_context *ctx, uint64_t wc_flags, uint32_t mask,
				 uint32_t flags)
{
	struct ibv_cq_init_attr_ex a = {
		.cqe = 16,
		.wc_flags = wc_flags,
		.comp_mask = mask,
		.flags = flags,
	};
	return ibv_create_cq_ex(ctx, &a);
}

static void attribute_cases(struct ibv_context *ctx)
{
	errno = 0;
	struct ibv_cq_ex *c = make_cq(ctx, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, 0, 0);
	report("completion_timestamp_flag_is_eopnotsupp", !c && errno == EOPNOTSUPP,
	       "cq %ld errno %ld", (long)(c != NULL), errno);
	errno = 0;
	c = make_cq(ctx, IBV_WC_STANDARD_FLAGS, 1u << 7, 0);
	report("unknown_comp_mask_is_einval", !c && errno == EINVAL, "cq %ld errno %ld",
	       (long)(c != NULL), errno);
	errno = 0;
	c = make_cq(ctx, IBV_WC_STANDARD_FLAGS, IBV_CQ_INIT_ATTR_MASK_FLAGS,
		    IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN);
	report("ignore_overrun_is_eopnotsupp", !c && errno == EOPNOTSUPP, "cq %ld errno %ld",
	       (long)(c != NULL), errno);
	c = make_cq(ctx, IBV_WC_STANDARD_FLAGS, IBV_CQ_INIT_ATTR_MASK_FLAGS,
		    IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
	report("single_threaded_is_accepted", c != NULL, "errno %ld %ld", errno, 0);
	if (c) {
		struct ibv_poll_cq_attr attr = {};
		int r = ibv_start_poll(c, &attr);
		report("start_poll_on_an_empty_cq_is_enoent", r == ENOENT, "r %ld %ld", r, 0);
		report("destroy_cq_ex", ibv_destroy_cq(ibv_cq_ex_to_cq(c)) == 0, "errno %ld %ld",
		       errno, 0);
	}
}

static int run_server(struct ibv_cq_ex *cq, struct ibv_qp *qp, struct ibv_mr *mr, char *buf,
		      int fd)
{
	int in_batch = 0;
	int r = next_wc(cq, &in_batch);
	report("first_receive_polled", r == 0, "r %ld %ld", r, 0);
	if (r)
		return 1;
	report("first_receive_status_and_wr_id", cq->status == IBV_WC_SUCCESS && cq->wr_id == 1,
	       "status %ld wr_id %ld", cq->status, (long)cq->wr_id);
	report("first_receive_opcode", ibv_wc_read_opcode(cq) == IBV_WC_RECV, "opcode %ld %ld",
	       ibv_wc_read_opcode(cq), 0);
	report("first_receive_byte_len", ibv_wc_read_byte_len(cq) == 100, "byte_len %ld %ld",
	       ibv_wc_read_byte_len(cq), 0);
	unsigned flags = ibv_wc_read_wc_flags(cq);
	report("first_receive_has_imm", (flags & IBV_WC_WITH_IMM) != 0, "wc_flags %#lx %ld",
	       flags, 0);
	report("first_receive_imm_data", ibv_wc_read_imm_data(cq) == htonl(IMM), "imm %#lx %ld",
	       (long)ntohl(ibv_wc_read_imm_data(cq)), 0);
	report("first_receive_qp_num", ibv_wc_read_qp_num(cq) == qp->qp_num, "qp %#lx want %#lx",
	       ibv_wc_read_qp_num(cq), qp->qp_num);
	report("first_receive_bytes", buf[0] == 'a' && buf[99] == 'a', "bytes %ld %ld", buf[0],
	       buf[99]);
	r = next_wc(cq, &in_batch);
	report("second_receive_polled", r == 0 && cq->wr_id == 2, "r %ld wr_id %ld", r,
	       (long)cq->wr_id);
	if (r)
		return 1;
	report("second_receive_byte_len_and_no_imm",
	       ibv_wc_read_byte_len(cq) == 7 && !(ibv_wc_read_wc_flags(cq) & IBV_WC_WITH_IMM),
	       "byte_len %ld wc_flags %#lx", ibv_wc_read_byte_len(cq), ibv_wc_read_wc_flags(cq));
	if (in_batch)
		ibv_end_poll(cq);
	/* Tell the client, which then sends the third message. */
	char go = 1;
	if (xfer(fd, &go, NULL, 1))
		return 1;
	struct ibv_wc wc = {};
	int n = 0;
	for (int i = 0; i < 1000000 && n == 0; i++) {
		n = ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc);
		if (n == 0)
			usleep(10);
	}
	report("ibv_poll_cq_on_the_same_cq", n == 1 && wc.wr_id == 3 && wc.byte_len == 5,
	       "n %ld wr_id %ld", n, (long)wc.wr_id);
	(void)mr;
	return 0;
}

static int run_client(struct ibv_cq_ex *cq, struct ibv_qp *qp, struct ibv_mr *mr, char *buf,
		      int fd)
{
	memset(buf, 'a', 100);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 100, .lkey = mr->lkey};
	struct ibv_send_wr wr = {
		.wr_id = 11,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(IMM),
	};
	struct ibv_send_wr *bad;
	int r = ibv_post_send(qp, &wr, &bad);
	struct ibv_sge sge2 = {.addr = (uintptr_t)buf + 100, .length = 7, .lkey = mr->lkey};
	struct ibv_send_wr wr2 = {
		.wr_id = 12,
		.sg_list = &sge2,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	r |= ibv_post_send(qp, &wr2, &bad);
	report("two_sends_posted", r == 0, "r %ld %ld", r, 0);
	int in_batch = 0;
	r = next_wc(cq, &in_batch);
	report("first_send_completion",
	       r == 0 && cq->status == IBV_WC_SUCCESS && cq->wr_id == 11 &&
		       ibv_wc_read_opcode(cq) == IBV_WC_SEND,
	       "r %ld wr_id %ld", r, (long)cq->wr_id);
	r = next_wc(cq, &in_batch);
	report("second_send_completion",
	       r == 0 && cq->status == IBV_WC_SUCCESS && cq->wr_id == 12 &&
		       ibv_wc_read_qp_num(cq) == qp->qp_num,
	       "r %ld wr_id %ld", r, (long)cq->wr_id);
	if (in_batch)
		ibv_end_poll(cq);
	char go;
	if (xfer(fd, NULL, &go, 1))
		return 1;
	struct ibv_sge sge3 = {.addr = (uintptr_t)buf, .length = 5, .lkey = mr->lkey};
	struct ibv_send_wr wr3 = {
		.wr_id = 13,
		.sg_list = &sge3,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	r = ibv_post_send(qp, &wr3, &bad);
	in_batch = 0;
	r |= next_wc(cq, &in_batch);
	report("third_send_completion", r == 0 && cq->wr_id == 13, "r %ld wr_id %ld", r,
	       (long)cq->wr_id);
	if (in_batch)
		ibv_end_poll(cq);
	return 0;
}

int main(int argc, char **argv)
{
	const char *server;
	int gidx;
	struct ibv_context *ctx = open_from_args(argc, argv, &server, &gidx);
	if (!ctx)
		return 100;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!server)
		attribute_cases(ctx);
	struct ibv_cq_ex *cq = make_cq(ctx, IBV_WC_STANDARD_FLAGS, 0, 0);
	report("create_cq_ex_with_the_standard_flags", pd && cq != NULL, "errno %ld %ld", errno,
	       0);
	static char buf[4096];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp *qp = cq && mr ? rc_qp(pd, ibv_cq_ex_to_cq(cq)) : NULL;
	if (!qp) {
		perror("setup");
		return 100;
	}
	struct hello me = {.qpn = qp->qp_num, .psn = 0x4242}, them;
	ibv_query_gid(ctx, 1, gidx, &me.gid);
	int fd = tcp(server, atoi(argv[3]));
	if (fd < 0 || xfer(fd, &me, &them, sizeof(me))) {
		perror("exchange");
		return 100;
	}
	if (connect_qp(qp, them.qpn, them.psn, &them.gid, gidx)) {
		perror("connect");
		return 100;
	}
	if (!server) {
		for (int i = 0; i < 3; i++) {
			struct ibv_sge sge = {.addr = (uintptr_t)buf + 1024 * i,
					      .length = 1024,
					      .lkey = mr->lkey};
			struct ibv_recv_wr rwr = {.wr_id = i + 1, .sg_list = &sge, .num_sge = 1};
			struct ibv_recv_wr *bad;
			if (ibv_post_recv(qp, &rwr, &bad)) {
				perror("ibv_post_recv");
				return 100;
			}
		}
	}
	/* Both QPs are ready, and the server's receives posted, before the client sends. */
	char ready = 1;
	if (xfer(fd, &ready, &ready, 1))
		return 100;
	int r = server ? run_client(cq, qp, mr, buf, fd) : run_server(cq, qp, mr, buf, fd);
	/* The client waits for the server's last poll before it tears down. */
	if (xfer(fd, &ready, &ready, 1))
		return 100;
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return r ? r : failures != 0;
}
