/* Two RC QPs of one device connected to each other through libibverbs, in one process, as
 * RDMA libraries' test suites connect them: tests/tests/verbs.rs runs it on the drop-in
 * library (roce exec) on one end of a veth pair.
 *
 *   loopback DEVICE GID_INDEX
 *
 * Connects QP A to QP B through the device's own GID, then from A: a SEND into B's posted
 * receive and an RDMA WRITE into B's region, each checked byte by byte. Each check prints
 * "CASE name ok" or "CASE name FAIL ...". */
#include "common.h"

#define LEN 8192

static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 1000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		usleep(10);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: loopback DEVICE GID_INDEX\n");
		return 100;
	}
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "no device %s\n", argv[1]);
		return 100;
	}
	int gidx = atoi(argv[2]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cqa = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *cqb = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	static char a[LEN], b[LEN];
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *mra = ibv_reg_mr(pd, a, LEN, access);
	struct ibv_mr *mrb = ibv_reg_mr(pd, b, LEN, access);
	struct ibv_qp *qa = rc_qp(pd, cqa), *qb = rc_qp(pd, cqb);
	union ibv_gid gid;
	if (!mra || !mrb || !qa || !qb || ibv_query_gid(ctx, 1, gidx, &gid)) {
		perror("setup");
		return 100;
	}
	int c1 = connect_qp(qa, qb->qp_num, 0x300, &gid, gidx);
	int c2 = connect_qp(qb, qa->qp_num, 0x300, &gid, gidx);
	report("connect_both_qps_to_the_own_gid", !c1 && !c2, "%ld %ld", c1, c2);

	struct ibv_sge rs = {.addr = (uintptr_t)b, .length = 64, .lkey = mrb->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 7, .sg_list = &rs, .num_sge = 1}, *rbad;
	ibv_post_recv(qb, &rwr, &rbad);
	strcpy(a, "loopback send");
	struct ibv_sge ss = {.addr = (uintptr_t)a, .length = 14, .lkey = mra->lkey};
	struct ibv_send_wr swr = {.wr_id = 1,
				  .sg_list = &ss,
				  .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED},
			   *sbad;
	int r = ibv_post_send(qa, &swr, &sbad);
	struct ibv_wc wc = {};
	int n = wait_wc(cqa, &wc);
	report("send_completes", !r && n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 1,
	       "status %ld wr_id %ld", wc.status, (long)wc.wr_id);
	n = wait_wc(cqb, &wc);
	report("receive_completes_with_the_bytes",
	       n == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 14 &&
		       !strcmp(b, "loopback send") && wc.qp_num == qb->qp_num,
	       "status %ld byte_len %ld", wc.status, wc.byte_len);

	for (int i = 0; i < LEN; i++)
		a[i] = (char)(i * 7 + 1);
	ss.length = LEN;
	swr.wr_id = 2;
	swr.opcode = IBV_WR_RDMA_WRITE;
	swr.wr.rdma.remote_addr = (uintptr_t)b;
	swr.wr.rdma.rkey = mrb->rkey;
	r = ibv_post_send(qa, &swr, &sbad);
	n = wait_wc(cqa, &wc);
	report("write_completes", !r && n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 2,
	       "status %ld wr_id %ld", wc.status, (long)wc.wr_id);
	report("write_lands_in_the_other_qps_region", !memcmp(a, b, LEN), "%ld %ld", 0, 0);

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_dereg_mr(mra);
	ibv_dereg_mr(mrb);
	ibv_destroy_cq(cqa);
	ibv_destroy_cq(cqb);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return failures != 0;
}
