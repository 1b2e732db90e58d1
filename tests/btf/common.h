/*
 * Kernel-like base types and the two vmlinux structs the probes read (task_struct, file), shared
 * by the amdkfd models kfd-6.14.c and kfd-6.18.c. Not kernel headers: just enough layout, modelled
 * on upstream, to exercise BTF resolution. Compiled both with `clang -target bpf` (for BTF) and
 * with the host cc (truth.c, for offsetof/sizeof), so it includes no system header.
 */
#ifndef GPREEMPT_BTF_COMMON_H
#define GPREEMPT_BTF_COMMON_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef u32 uint32_t;
typedef _Bool bool;
typedef int pid_t;

#ifdef __clang__
#define __user __attribute__((btf_type_tag("user")))
#else
#define __user
#endif
#define __iomem

struct list_head {
	struct list_head *next, *prev;
};

struct hlist_node {
	struct hlist_node *next, **pprev;
};

struct kref {
	int refcount;
};

struct mutex {
	long owner;
	int wait_lock;
	struct list_head wait_list;
};

struct work_struct {
	long data;
	struct list_head entry;
	void (*func)(struct work_struct *work);
};

/* The kernel's kobject has bitfield flags: a member BTF resolution must refuse. */
struct kobject {
	const char *name;
	struct list_head entry;
	struct kobject *parent;
	struct kref kref;
	unsigned int state_initialized : 1;
	unsigned int state_in_sysfs : 1;
	unsigned int state_add_uevent_sent : 1;
	unsigned int uevent_suppress : 1;
};

struct thread_info {
	unsigned long flags;
	unsigned long syscall_work;
	u32 status;
	u32 cpu;
};

/* The fd -> file -> inode chain the ioctl programs follow (include/linux/fdtable.h, fs.h). */
struct file;
#if defined(__clang__) && defined(__BPF__)
/* As the kernel builds with BTF: the resolver must see through TYPE_TAG. */
#define __rcu __attribute__((btf_type_tag("rcu")))
#else
#define __rcu
#endif
typedef u32 dev_t;

struct super_block {
	struct list_head s_list;
	dev_t s_dev;
	unsigned char s_blocksize_bits;
	unsigned long s_blocksize;
};

struct inode {
	unsigned short i_mode;
	unsigned short i_opflags;
	u32 i_uid;
	u32 i_gid;
	unsigned int i_flags;
	const void *i_op;
	struct super_block *i_sb;
	void *i_mapping;
	unsigned long i_ino;
	union {
		const unsigned int i_nlink;
		unsigned int __i_nlink;
	};
	dev_t i_rdev;
	long long i_size;
};

struct fdtable {
	unsigned int max_fds;
	struct file __rcu **fd;
	unsigned long *close_on_exec;
	unsigned long *open_fds;
};

struct files_struct {
	int count;
	bool resize_in_progress;
	struct fdtable __rcu *fdt;
	struct fdtable fdtab;
};

/* tgid deep inside, as in the kernel (never at offset 0). */
struct task_struct {
	struct thread_info thread_info;
	unsigned int __state;
	void *stack;
	int prio;
	int static_prio;
	struct list_head tasks;
	pid_t pid;
	pid_t tgid;
	struct task_struct *real_parent;
	char comm[16];
	struct files_struct *files;
};

struct file_operations;
struct address_space;

/* Emitted in full (the kfd-*.c globals reach them only through pointers). */
struct files_struct g_files;
struct inode g_inode;
struct super_block g_sb;

/* 6.x: f_llist/f_pipe share an anonymous union. */
struct file {
	union {
		struct list_head f_llist;
		u64 f_pipe;
	};
	int f_lock;
	unsigned int f_mode;
	const struct file_operations *f_op;
	struct address_space *f_mapping;
	void *private_data;
	struct inode *f_inode;
	unsigned int f_flags;
};

long kfd_ioctl(struct file *filep, unsigned int cmd, unsigned long arg)
{
	return filep->private_data ? (long)cmd : (long)arg;
}

#endif
