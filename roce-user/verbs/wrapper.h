/* What bindgen reads: rdma-core's public verbs header, as installed by libibverbs-dev, and
   the kernel ABI structs of the `ibv_copy_*_from_kern` helpers (infiniband/marshall.h). */
#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>
