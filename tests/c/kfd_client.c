/* A KFD client written against the real uapi header: creates and destroys AQL queues through
 * whatever serves /dev/kfd, and prints what it got, one "key value" per line. */
#include <errno.h>
#include <fcntl.h>
#include <linux/kfd_ioctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

/* KFD 1.13 added RUNTIME_ENABLE; the installed header (KFD 1.11) may predate it. */
#ifndef AMDKFD_IOC_RUNTIME_ENABLE
struct kfd_ioctl_runtime_enable_args {
	__u64 r_debug;
	__u32 mode_mask;
	__u32 capabilities_mask;
};
#define KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK 1
#define AMDKFD_IOC_RUNTIME_ENABLE AMDKFD_IOWR(0x25, struct kfd_ioctl_runtime_enable_args)
#endif

/* -DTYPE_BYTE="'X'": every KFD ioctl with another type byte; amdkfd dispatches on nr alone, so
 * an observer that keys on 'K' would miss them all. */
#ifdef TYPE_BYTE
#undef AMDKFD_IOCTL_BASE
#define AMDKFD_IOCTL_BASE TYPE_BYTE
#endif

static int fd;

static int kfd(unsigned long cmd, void *args) { return ioctl(fd, cmd, args) < 0 ? -errno : 0; }

static void map(uint32_t gpu, void *p, uint64_t size) {
	struct kfd_ioctl_alloc_memory_of_gpu_args a = {
		.va_addr = (uintptr_t)p, .size = size, .mmap_offset = (uintptr_t)p, .gpu_id = gpu,
		.flags = KFD_IOC_ALLOC_MEM_FLAGS_USERPTR | KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE};
	if (kfd(AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, &a)) { perror("alloc"); exit(1); }
	uint32_t devs[1] = {gpu};
	struct kfd_ioctl_map_memory_to_gpu_args m = {
		.handle = a.handle, .device_ids_array_ptr = (uintptr_t)devs, .n_devices = 1};
	if (kfd(AMDKFD_IOC_MAP_MEMORY_TO_GPU, &m)) { perror("map"); exit(1); }
}

static int create(uint32_t gpu, uint32_t prio, uint32_t type, uint32_t *qid, uint64_t *db) {
	void *page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *ring = mmap(0, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	map(gpu, page, 4096);
	map(gpu, ring, 65536);
	struct kfd_ioctl_create_queue_args c = {
		.ring_base_address = (uintptr_t)ring, .write_pointer_address = (uintptr_t)page + 0x38,
		.read_pointer_address = (uintptr_t)page + 0x80, .ring_size = 65536, .gpu_id = gpu,
		.queue_type = type, .queue_percentage = 100, .queue_priority = prio};
	int r = kfd(AMDKFD_IOC_CREATE_QUEUE, &c);
	*qid = c.queue_id;
	*db = c.doorbell_offset;
	return r;
}

int main(void) {
	fd = open("/dev/kfd", O_RDWR | O_CLOEXEC);
	if (fd < 0) { perror("/dev/kfd"); return 1; }
	struct kfd_ioctl_get_version_args v = {0};
	printf("ioctl_type %c\n", (int)_IOC_TYPE(AMDKFD_IOC_CREATE_QUEUE));
	printf("version_ret %d\n", kfd(AMDKFD_IOC_GET_VERSION, &v));
	printf("version %u.%u\n", v.major_version, v.minor_version);
	char buf[32] = {0};
	FILE *f = fopen("/sys/class/kfd/kfd/topology/nodes/1/gpu_id", "r");
	if (!f || !fgets(buf, sizeof buf, f)) { perror("gpu_id"); return 1; }
	uint32_t gpu = strtoul(buf, 0, 10);
	printf("gpu_id %u\n", gpu);
	uint32_t qid = 99;
	uint64_t db = 0;
	struct kfd_ioctl_create_queue_args early = {
		.ring_base_address = 0x100000, .write_pointer_address = 0x200038,
		.read_pointer_address = 0x200080, .ring_size = 4096, .gpu_id = gpu,
		.queue_type = KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, .queue_percentage = 100};
	printf("create_before_vm %d\n", kfd(AMDKFD_IOC_CREATE_QUEUE, &early));
	struct kfd_ioctl_acquire_vm_args vm = {.drm_fd = fd, .gpu_id = gpu};
	printf("acquire_vm %d\n", kfd(AMDKFD_IOC_ACQUIRE_VM, &vm));
	struct kfd_ioctl_runtime_enable_args rt = {.mode_mask = KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK};
	printf("runtime_enable %d\n", kfd(AMDKFD_IOC_RUNTIME_ENABLE, &rt));
	for (int i = 0; i < 2; i++) {
		int r = create(gpu, 3 + i, KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, &qid, &db);
		printf("create %d queue_id %u doorbell_offset 0x%llx\n", r, qid, (unsigned long long)db);
	}
	printf("create_bad_priority %d\n", create(gpu, 16, KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, &qid, &db));
	printf("create_bad_type %d\n", create(gpu, 7, 9, &qid, &db));
	printf("runtime_enable_again %d\n", kfd(AMDKFD_IOC_RUNTIME_ENABLE, &rt));
	struct kfd_ioctl_destroy_queue_args d = {.queue_id = 0};
	printf("destroy0 %d\n", kfd(AMDKFD_IOC_DESTROY_QUEUE, &d));
	printf("destroy0_again %d\n", kfd(AMDKFD_IOC_DESTROY_QUEUE, &d));
	int r = create(gpu, 7, KFD_IOC_QUEUE_TYPE_COMPUTE_AQL, &qid, &db);
	printf("recreate %d queue_id %u\n", r, qid);
	printf("unknown_nr %d\n", ioctl(fd, _IOWR('K', 0x80, uint64_t), buf) < 0 ? -errno : 0);
	fflush(stdout);
	if (getenv("HOLD")) pause();
	return 0;
}
