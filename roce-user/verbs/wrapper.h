/* What bindgen reads: rdma-core's public verbs header, as installed by libibverbs-dev. */
#include <infiniband/verbs.h>
