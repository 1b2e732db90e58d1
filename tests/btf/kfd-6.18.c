/*
 * amdkfd structs and prototypes modelled on Linux 6.18: pasid moved from kfd_process to
 * kfd_process_device (commit 8544374c0f82), pm_send_unmap_queue lost its queue type, the upstream
 * kfd_process_evict_queues has no force flag, and "remove DIQ support" renumbered kfd_queue_type.
 * See reference/kfd.md §3 and §7. A model, not the kernel's headers: members were added so that
 * the fields the probes read sit at other offsets than in kfd-6.14.c.
 */
#include "common.h"

#define MAX_GPU_INSTANCE 64
#define KFD_HAS_PDD_PASID 1

enum kfd_queue_type {
	KFD_QUEUE_TYPE_COMPUTE,
	KFD_QUEUE_TYPE_SDMA,
	KFD_QUEUE_TYPE_HIQ,
	KFD_QUEUE_TYPE_SDMA_XGMI,
	KFD_QUEUE_TYPE_SDMA_BY_ENG_ID
};

enum kfd_queue_format {
	KFD_QUEUE_FORMAT_PM4,
	KFD_QUEUE_FORMAT_AQL
};

enum kfd_unmap_queues_filter {
	KFD_UNMAP_QUEUES_FILTER_ALL_QUEUES = 1,
	KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES = 2,
	KFD_UNMAP_QUEUES_FILTER_BY_PASID = 3
};

enum amdgpu_mes_priority_level {
	AMDGPU_MES_PRIORITY_LEVEL_LOW = 0,
	AMDGPU_MES_PRIORITY_LEVEL_NORMAL = 1,
	AMDGPU_MES_PRIORITY_LEVEL_MEDIUM = 2,
	AMDGPU_MES_PRIORITY_LEVEL_HIGH = 3,
	AMDGPU_MES_PRIORITY_LEVEL_REALTIME = 4
};

/* A 64-bit enum, as the kernel has a few of (BTF ENUM64). */
enum kfd_smi_mask64 {
	KFD_SMI_EVENT_ALL_PROCESS = 1ULL << 40
};

struct queue_properties {
	enum kfd_queue_type type;
	enum kfd_queue_format format;
	unsigned int queue_id;
	/* Model: the ring inside an anonymous union, to test member descent. */
	union {
		struct {
			u64 queue_address;
			u64 queue_size;
		};
		u64 ring[2];
	};
	u32 metadata_queue_size;
	u32 priority;
	u32 queue_percent;
	void __user *read_ptr;
	void __user *write_ptr;
	void __iomem *doorbell_ptr;
	u32 doorbell_off;
	bool is_interop;
	bool is_evicted;
	bool is_suspended;
	bool is_being_destroyed;
	bool is_active;
	bool is_gws;
	u32 pm4_target_xcc;
	bool is_dbg_wa;
	bool is_user_cu_masked;
	bool is_reset;
	unsigned int vmid;
	u32 sdma_engine_id;
	u32 sdma_queue_id;
	u64 sdma_vm_addr;
	u64 eop_ring_buffer_address;
	u32 eop_ring_buffer_size;
	u64 ctx_save_restore_area_address;
	u32 ctx_save_restore_area_size;
	u32 ctl_stack_size;
	u64 tba_addr;
	u64 tma_addr;
	u64 exception_status;
	void *wptr_bo;
	void *rptr_bo;
	void *ring_bo;
	void *eop_buf_bo;
	void *cwsr_bo;
};

struct kfd_mem_obj;
struct kfd_process;
struct kfd_node;

struct queue {
	struct list_head list;
	void *mqd;
	struct kfd_mem_obj *mqd_mem_obj;
	u64 gart_mqd_addr;
	struct queue_properties properties;
	uint32_t mec;
	uint32_t pipe;
	uint32_t queue;
	unsigned int sdma_id;
	unsigned int doorbell_id;
	struct kfd_process *process;
	struct kfd_node *device;
	void *gws;
	struct kobject kobj;
	void *gang_ctx_bo;
	u64 gang_ctx_gpu_addr;
	void *gang_ctx_cpu_ptr;
	void *wptr_bo_gart;
};

struct mmu_notifier {
	struct hlist_node hlist;
	const void *ops;
	void *mm;
};

struct qcm_process_device {
	struct list_head queues_list;
	unsigned int queue_count;
	unsigned int vmid;
	bool is_debug;
	unsigned int evicted;
	u64 page_table_base;
};

struct kfd_process_device {
	struct kfd_node *dev;
	struct kfd_process *process;
	struct qcm_process_device qpd;
	void *drm_priv;
	u64 vram_usage;
	u64 last_evict_timestamp;
	u32 user_gpu_id;
	bool has_reset_queue;
	u32 pasid;
};

struct kfd_process {
	struct hlist_node kfd_processes;
	void *mm;
	struct kref ref;
	struct work_struct release_work;
	struct mutex mutex;
	/* Model: secondary contexts (KFD 1.19) placed before lead_thread so that it moves. */
	u16 context_id;
	struct task_struct *lead_thread;
	struct mmu_notifier mmu_notifier;
	struct kfd_process_device *pdds[MAX_GPU_INSTANCE];
	uint32_t n_pdds;
	bool debug_trap_enabled;
	u64 exception_enable_mask;
};

struct kfd_vmid_info {
	uint32_t first_vmid_kfd;
	uint32_t last_vmid_kfd;
	uint32_t vmid_num_kfd;
};

struct device_queue_manager;

struct kfd_node {
	unsigned int node_id;
	void *adev;
	uint32_t xcc_mask;
	uint32_t interrupt_bitmap;
	struct kfd_vmid_info vm_info;
	unsigned int id;
	struct device_queue_manager *dqm;
	void *kfd;
};

struct packet_manager {
	struct device_queue_manager *dqm;
	void *priv_queue;
	struct mutex lock;
	bool allocated;
	void *ib_buffer_obj;
	unsigned int ib_size_bytes;
	bool is_over_subscription;
	const void *pmf;
};

struct device_queue_manager_ops {
	int (*create_queue)(struct device_queue_manager *dqm, struct queue *q);
	int (*destroy_queue)(struct device_queue_manager *dqm, struct queue *q);
	int (*update_queue)(struct device_queue_manager *dqm, struct queue *q);
	int (*evict_process_queues)(struct device_queue_manager *dqm);
	int (*restore_process_queues)(struct device_queue_manager *dqm);
	int (*reset_queues)(struct device_queue_manager *dqm, u16 pasid);
};

struct device_queue_manager {
	struct device_queue_manager_ops ops;
	void *mqd_mgrs[4];
	struct packet_manager packet_mgr;
	struct kfd_node *dev;
	unsigned int sched_policy;
	bool sched_running;
};

struct mes_add_queue_input {
	uint32_t process_id;
	u64 page_table_base_addr;
	u64 process_va_start;
	u64 process_va_end;
	u64 process_quantum;
	u64 process_context_addr;
	u64 gang_quantum;
	u64 gang_context_addr;
	uint32_t inprocess_gang_priority;
	enum amdgpu_mes_priority_level gang_global_priority_level;
	uint32_t xcc_id;
	uint32_t doorbell_offset;
	u64 mqd_addr;
	u64 wptr_addr;
	u64 wptr_mc_addr;
	uint32_t queue_type;
	uint32_t paging;
	uint32_t gws_base;
	uint32_t gws_size;
	u64 tba_addr;
	u64 tma_addr;
	uint32_t trap_en;
	uint32_t skip_process_ctx_clear;
	uint32_t is_kfd_process;
	uint32_t is_aql_queue;
	uint32_t queue_size;
	uint32_t exclusively_scheduled;
};

struct mes_remove_queue_input {
	uint32_t doorbell_offset;
	u64 gang_context_addr;
	bool remove_queue_after_reset;
	uint32_t queue_type;
};

struct amdgpu_mes;

/* Globals make the compiler emit every struct in full. */
struct queue g_queue;
struct kfd_process g_process;
struct kfd_process_device g_pdd;
struct kfd_node g_node;
struct device_queue_manager g_dqm;
struct mes_add_queue_input g_mes_add;
struct mes_remove_queue_input g_mes_remove;
struct task_struct g_task;
struct file g_file;
enum kfd_smi_mask64 g_smi_mask;

int pm_send_unmap_queue(struct packet_manager *pm, enum kfd_unmap_queues_filter filter,
			uint32_t filter_param, bool reset)
{
	return pm->allocated + filter + filter_param + reset;
}

int kfd_process_evict_queues(struct kfd_process *p, uint32_t trigger)
{
	return p->n_pdds + trigger;
}

int kfd_process_restore_queues(struct kfd_process *p)
{
	return p->n_pdds;
}

void kfd_procfs_add_queue(struct queue *q)
{
	q->mec = 0;
}

int pm_send_runlist(struct packet_manager *pm, struct list_head *dqm_queues)
{
	return pm->allocated && dqm_queues;
}

int mes_v12_0_add_hw_queue(struct amdgpu_mes *mes, struct mes_add_queue_input *input)
{
	return mes ? (int)input->doorbell_offset : 0;
}

int mes_v12_0_remove_hw_queue(struct amdgpu_mes *mes, struct mes_remove_queue_input *input)
{
	return mes ? (int)input->doorbell_offset : 0;
}

/* Parameter positions, as declared above, for truth.c: P(function, parameter, index, type). */
#define KFD_PARAMS(P)                                                                  \
	P(pm_send_unmap_queue, filter, 1, enum kfd_unmap_queues_filter)                \
	P(pm_send_unmap_queue, filter_param, 2, uint32_t)                               \
	P(kfd_process_evict_queues, trigger, 1, uint32_t)
