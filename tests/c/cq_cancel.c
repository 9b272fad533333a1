/* pthread_cancel of a thread blocked in ibv_get_cq_event, as rping cancels its CQ thread when
 * a connection fails: the thread ends (pthread_join gives PTHREAD_CANCELED), the process goes
 * on, and the CQ and its channel are destroyed afterwards. tests/tests/verbs.rs runs it on
 * the drop-in library (roce exec).
 *
 *   cq_cancel DEVICE
 *
 * Prints "CASE name ok" or "CASE name FAIL ..." for each check. */
#include "common.h"

#include <pthread.h>

static struct ibv_comp_channel *channel;
static volatile int waiting;

static void *waiter(void *arg)
{
	struct ibv_cq *cq;
	void *cq_context;
	(void)arg;
	waiting = 1;
	ibv_get_cq_event(channel, &cq, &cq_context);
	/* Only reached if an event came: the test posts none. */
	waiting = 2;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: cq_cancel DEVICE\n");
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
	channel = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = channel ? ibv_create_cq(ctx, 16, NULL, channel, 0) : NULL;
	report("make_a_cq_on_a_channel", cq && !ibv_req_notify_cq(cq, 0), "cq %ld errno %ld",
	       (long)(cq != NULL), errno);
	if (!cq)
		return 1;
	pthread_t t;
	pthread_create(&t, NULL, waiter, NULL);
	while (!waiting)
		usleep(1000);
	usleep(200000);
	report("the_waiter_still_waits", waiting == 1, "waiting %ld%ld", waiting, 0);
	void *res = NULL;
	int c = pthread_cancel(t);
	int j = pthread_join(t, &res);
	report("cancel_ends_the_waiting_thread", !c && !j && res == PTHREAD_CANCELED,
	       "cancel %ld join %ld", c, j);
	report("destroy_the_cq_and_channel_after",
	       !ibv_destroy_cq(cq) && !ibv_destroy_comp_channel(channel), "%ld%ld", 0, 0);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("cq_cancel done\n");
	return failures;
}
