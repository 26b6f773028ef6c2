/* Both halves of libpmix's API: the client calls (pmix.h) for the test client and the
 * server-side calls plus the host module (pmix_server.h) for the daemon. */
#include <pmix.h>
#include <pmix_server.h>
