/*
 * Independent truth for tests/tests/btf.rs: built by the host cc with KFD_SRC naming one of the
 * kfd-*.c models, prints where the compiler put every field the probes read, one per line:
 *   member <struct>.<member> <offsetof> <sizeof>
 *   param <function>.<parameter> <index> <sizeof>
 * Members a version lacks are not printed.
 */
#include KFD_SRC

int printf(const char *fmt, ...);

#define M(s, m)                                                                        \
	printf("member %s.%s %lu %lu\n", #s, #m, (unsigned long)__builtin_offsetof(struct s, m), \
	       (unsigned long)sizeof(((struct s *)0)->m));
#define P(f, p, index, type) printf("param %s.%s %d %lu\n", #f, #p, index, (unsigned long)sizeof(type));

int main(void)
{
	M(queue, properties)
	M(queue, process)
	M(queue, device)
	M(queue, pipe)
	M(queue, queue)
	M(queue_properties, queue_id)
	M(queue_properties, type)
	M(queue_properties, priority)
	M(queue_properties, doorbell_off)
	M(queue_properties, queue_address)
	M(queue_properties, queue_size)
	M(kfd_process, lead_thread)
#ifdef KFD_HAS_PROCESS_PASID
	M(kfd_process, pasid)
#endif
	M(task_struct, tgid)
	M(kfd_node, id)
	M(packet_manager, dqm)
	M(device_queue_manager, dev)
	M(mes_add_queue_input, process_id)
	M(mes_add_queue_input, doorbell_offset)
	M(mes_add_queue_input, queue_type)
	M(mes_remove_queue_input, doorbell_offset)
	M(file, private_data)
	M(task_struct, files)
	M(files_struct, fdt)
	M(fdtable, max_fds)
	M(fdtable, fd)
	M(file, f_inode)
	M(inode, i_rdev)
	M(inode, i_ino)
	M(inode, i_sb)
	M(super_block, s_dev)
#ifdef KFD_HAS_PDD_PASID
	M(kfd_process_device, pasid)
#endif
	KFD_PARAMS(P)
	return 0;
}
