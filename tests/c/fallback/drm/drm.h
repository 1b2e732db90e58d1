/* kfd_ioctl.h includes <drm/drm.h> only for the __u32/__u64 types. Debian 12 ships that header
 * in libdrm-dev, not linux-libc-dev: C builds add this directory with -idirafter (after the
 * system directories, so a real drm.h wins). */
#include <linux/types.h>
#include <linux/ioctl.h>
