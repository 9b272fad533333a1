/* A UC queue pair through libibverbs, checked call by call: tests/tests/verbs.rs compiles this
 * against the installed headers and runs it on the drop-in library (roce exec).
 *
 *   uc_verbs DEVICE GID_INDEX PEER_IPV4
 *
 * Creates a UC QP, walks it RESET -> INIT -> RTR -> RTS with UC's attribute masks
 * (ibv_modify_qp(3)), checks that RC-only attributes are refused (EINVAL), that
 * ibv_query_qp reports what was set, and that RDMA READ and atomics are refused by
 * ibv_post_send with EINVAL and *bad_wr set. Prints "uc_verbs: ok" and exits 0, or says what
 * failed and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "uc_verbs: %s:%d: ", __FILE__, __LINE__);         \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, "\n");                                             \
			failures++;                                                        \
		}                                                                          \
	} while (0)

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: uc_verbs DEVICE GID_INDEX PEER_IPV4\n");
		return 2;
	}
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_device *dev = NULL;
	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			dev = list[i];
	if (!dev) {
		fprintf(stderr, "uc_verbs: no device %s\n", argv[1]);
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	static char buf[4096];
	struct ibv_mr *mr = cq ? ibv_reg_mr(pd, buf, sizeof buf,
					   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
			       : NULL;
	if (!mr) {
		fprintf(stderr, "uc_verbs: setup failed: %s\n", strerror(errno));
		return 1;
	}
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_UC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	if (!qp) {
		fprintf(stderr, "uc_verbs: ibv_create_qp(UC): %s\n", strerror(errno));
		return 1;
	}
	CHECK(qp->qp_type == IBV_QPT_UC, "qp_type %d", qp->qp_type);

	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	CHECK(r == EINVAL, "INIT with a Q_Key (UD's) and no access flags: %d, want EINVAL", r);
	r = ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	CHECK(r == 0, "INIT: %d", r);

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = 0x1234;
	a.rq_psn = 0x111;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.grh.sgid_index = atoi(argv[2]);
	a.ah_attr.grh.dgid.raw[10] = 0xff;
	a.ah_attr.grh.dgid.raw[11] = 0xff;
	if (inet_pton(AF_INET, argv[3], &a.ah_attr.grh.dgid.raw[12]) != 1) {
		fprintf(stderr, "uc_verbs: bad IPv4 %s\n", argv[3]);
		return 2;
	}
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	a.max_dest_rd_atomic = 1;
	r = ibv_modify_qp(qp, &a, rtr | IBV_QP_MAX_DEST_RD_ATOMIC);
	CHECK(r == EINVAL, "RTR with RC's max_dest_rd_atomic: %d, want EINVAL", r);
	r = ibv_modify_qp(qp, &a, rtr & ~IBV_QP_RQ_PSN);
	CHECK(r == EINVAL, "RTR without RQ_PSN: %d, want EINVAL", r);
	r = ibv_modify_qp(qp, &a, rtr);
	CHECK(r == 0, "RTR: %d", r);

	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x222;
	a.timeout = 14;
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT);
	CHECK(r == EINVAL, "RTS with RC's timeout: %d, want EINVAL", r);
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	CHECK(r == 0, "RTS: %d", r);

	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	memset(&q, 0xaa, sizeof q);
	r = ibv_query_qp(qp, &q, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					 IBV_QP_SQ_PSN | IBV_QP_ACCESS_FLAGS,
			 &qi);
	CHECK(r == 0, "ibv_query_qp: %d", r);
	CHECK(q.qp_state == IBV_QPS_RTS, "state %d", q.qp_state);
	CHECK(q.path_mtu == IBV_MTU_1024, "path_mtu %d", q.path_mtu);
	CHECK(q.dest_qp_num == 0x1234, "dest_qp_num %#x", q.dest_qp_num);
	CHECK(q.rq_psn == 0x111, "rq_psn %#x", q.rq_psn);
	CHECK(q.sq_psn == 0x222, "sq_psn %#x", q.sq_psn);
	CHECK(q.qp_access_flags == IBV_ACCESS_REMOTE_WRITE, "access %#x", q.qp_access_flags);
	CHECK(q.timeout == 0 && q.max_rd_atomic == 0, "RC-only attributes %d %d", q.timeout,
	      q.max_rd_atomic);
	CHECK(qi.qp_type == IBV_QPT_UC, "init qp_type %d", qi.qp_type);

	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	enum ibv_wr_opcode refused[] = {IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP,
					IBV_WR_ATOMIC_FETCH_AND_ADD};
	for (unsigned i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		struct ibv_send_wr wr = {
			.wr_id = i,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = refused[i],
			.send_flags = IBV_SEND_SIGNALED,
		};
		wr.wr.rdma.remote_addr = 0x1000;
		wr.wr.rdma.rkey = 1;
		struct ibv_send_wr *bad = NULL;
		r = ibv_post_send(qp, &wr, &bad);
		CHECK(r == EINVAL && bad == &wr, "post_send opcode %d on UC: %d, want EINVAL",
		      refused[i], r);
	}
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "a completion for a refused WR");

	CHECK(ibv_destroy_qp(qp) == 0, "destroy qp");
	CHECK(ibv_dereg_mr(mr) == 0, "dereg mr");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc pd");
	CHECK(ibv_close_device(ctx) == 0, "close device");
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("uc_verbs: ok\n");
	return 0;
}
