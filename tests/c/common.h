/*
 * What the C programs of tests/c/ share: the case report, the out-of-band TCP socket (as
 * ibv_rc_pingpong's) and an RC QP connected to a peer's, the way ibv_rc_pingpong connects it.
 * Static functions in a header, so each program stays one file for gcc.
 */
#ifndef ROCE_TESTS_COMMON_H
#define ROCE_TESTS_COMMON_H

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The number of failed cases: the exit status of a program that reports cases. */
static int failures;

/* Prints "CASE name ok", or "CASE name FAIL" with `fmt` filled from a and b (and counts it). */
static void report(const char *name, int ok, const char *fmt, long a, long b)
{
	if (ok) {
		printf("CASE %s ok\n", name);
	} else {
		printf("CASE %s FAIL ", name);
		printf(fmt, a, b);
		printf("\n");
		failures++;
	}
	fflush(stdout);
}

/* Writes `len` bytes of `mine` (unless NULL), then reads `len` bytes into `theirs` (unless
 * NULL): one step of an exchange over the out-of-band socket. 0, or -1. */
static inline int xfer(int fd, const void *mine, void *theirs, size_t len)
{
	if (mine && write(fd, mine, len) != (ssize_t)len)
		return -1;
	size_t got = 0;
	while (theirs && got < len) {
		ssize_t n = read(fd, (char *)theirs + got, len - got);
		if (n <= 0)
			return -1;
		got += n;
	}
	return 0;
}

/* The command line of a case-reporting program, "PROG DEV GID_INDEX PORT [SERVER_IP]": opens
 * device DEV (its list stays allocated until exit, as the programs keep using it) and says
 * whether this end is the client (SERVER_IP given). NULL after printing why. */
static inline struct ibv_context *open_from_args(int argc, char **argv, const char **server, int *gidx)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s DEV GID_INDEX PORT [SERVER_IP]\n", argv[0]);
		return NULL;
	}
	*server = argc > 4 ? argv[4] : NULL;
	*gidx = atoi(argv[2]);
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		fprintf(stderr, "no device %s\n", argv[1]);
	return ctx;
}

static inline int tcp(const char *server, int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (server) {
		inet_pton(AF_INET, server, &sa.sin_addr);
		for (int i = 0; i < 100; i++) {
			if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
				return fd;
			usleep(100000);
		}
		return -1;
	}
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 1))
		return -1;
	int c = accept(fd, NULL, NULL);
	close(fd);
	return c;
}

static inline struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

static inline int connect_qp(struct ibv_qp *qp, uint32_t dqpn, uint32_t psn, const union ibv_gid *gid,
		      int gidx)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					     IBV_QP_MAX_QP_RD_ATOMIC);
}

#endif
