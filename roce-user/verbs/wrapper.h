/* What bindgen reads: rdma-core's public verbs header, as installed by libibverbs-dev, the
   kernel ABI structs of the `ibv_copy_*_from_kern` helpers (infiniband/marshall.h), and
   librdmacm's public header (librdmacm-dev) for the drop-in librdmacm (src/ffi/rdmacm.rs). */
#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/rdma_cma.h>
