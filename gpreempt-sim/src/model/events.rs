//! Events of the emulated amdkfd (`kfd_events.c`): CREATE / DESTROY / SET / RESET_EVENT and
//! WAIT_EVENTS, plus the signal from a completed packet that carries an event mailbox
//! (`kfd_signal_event_interrupt`).
//!
//! On a dGPU the runtime allocates the signal page itself (a host-visible buffer object) and hands
//! its handle to the first CREATE_EVENT in `event_page_offset` (`kfd_event_page_set` fills it
//! with UNSIGNALED_EVENT_SLOT). Signal events take the lowest free id below
//! `KFD_SIGNAL_EVENT_LIMIT`, which is also their slot; other events take ids from
//! `KFD_FIRST_NONSIGNAL_EVENT_ID`.

use gpreempt_common::kfd::{
    CreateEventArgs, DestroyEventArgs, EventData, ResetEventArgs, SetEventArgs, WaitEventsArgs,
};

use super::{done, err, Event, Host, Kfd, Outcome, Wait};

/// `KFD_SIGNAL_EVENT_LIMIT`: slots of the signal page (8 bytes each).
pub const SIGNAL_EVENT_LIMIT: u32 = 4096;
/// `KFD_FIRST_NONSIGNAL_EVENT_ID` = (INT_MAX >> 1) + 1.
pub const FIRST_NONSIGNAL_EVENT_ID: u32 = (i32::MAX as u32 >> 1) + 1;
/// `UNSIGNALED_EVENT_SLOT`.
pub const UNSIGNALED_SLOT: u64 = u64::MAX;
/// `KFD_IOC_WAIT_RESULT_*`.
const WAIT_COMPLETE: u32 = 0;
const WAIT_TIMEOUT: u32 = 1;
/// The most events one WAIT_EVENTS may name here (the kernel has no fixed cap; the emulator
/// bounds what it copies in).
const WAIT_MAX_EVENTS: u32 = 4096;

impl Kfd {
    /// `kfd_ioctl_create_event`.
    pub(super) fn create_event(&mut self, pid: u32, mut a: CreateEventArgs) -> Outcome {
        if a.event_page_offset != 0 {
            // The handle of the runtime's signal page: MAKE_HANDLE(gpu_id, idr id).
            let gpu_id = (a.event_page_offset >> 32) as u32;
            if self.gpu(gpu_id).is_none() {
                return err(libc::EINVAL, a.as_bytes());
            }
            let p = self.process_mut(pid);
            if !p.pdds.get(&gpu_id).is_some_and(|d| d.vm_acquired) {
                return err(libc::EINVAL, a.as_bytes());
            }
            let Some(va) = p.allocs.get(&a.event_page_offset).map(|m| m.va) else {
                return err(libc::EINVAL, a.as_bytes());
            };
            if p.event_page.is_some() {
                // "Event page is already set".
                return err(libc::EINVAL, a.as_bytes());
            }
            p.event_page = Some(va);
            self.pending_writes
                .push((pid, va, vec![0xff; SIGNAL_EVENT_LIMIT as usize * 8]));
        }
        let p = self.process_mut(pid);
        let ev = Event {
            kind: a.event_type,
            auto_reset: a.auto_reset != 0,
            signaled: false,
        };
        let id = if ev.is_signal() {
            let used = p.events.keys().filter(|&&i| i < SIGNAL_EVENT_LIMIT).count();
            if used as u32 >= SIGNAL_EVENT_LIMIT {
                return err(libc::ENOSPC, a.as_bytes());
            }
            let Some(id) = (0..SIGNAL_EVENT_LIMIT).find(|i| !p.events.contains_key(i)) else {
                return err(libc::ENOSPC, a.as_bytes());
            };
            a.event_page_offset = crate::mmap::kfd_offset(crate::mmap::TYPE_EVENTS, 0, 0, 0);
            a.event_slot_index = id;
            id
        } else {
            let Some(id) =
                (FIRST_NONSIGNAL_EVENT_ID..=i32::MAX as u32).find(|i| !p.events.contains_key(i))
            else {
                return err(libc::ENOMEM, a.as_bytes());
            };
            id
        };
        if let (true, Some(page)) = (ev.is_signal(), p.event_page) {
            self.pending_writes.push((
                pid,
                page + u64::from(id) * 8,
                UNSIGNALED_SLOT.to_le_bytes().to_vec(),
            ));
        }
        let p = self.process_mut(pid);
        p.events.insert(id, ev);
        a.event_id = id;
        a.event_trigger_data = id;
        done(0, a.as_bytes())
    }

    pub(super) fn destroy_event(&mut self, pid: u32, a: DestroyEventArgs) -> Outcome {
        match self.process_mut(pid).events.remove(&a.event_id) {
            Some(_) => done(0, a.as_bytes()),
            None => err(libc::EINVAL, a.as_bytes()),
        }
    }

    /// SET_EVENT and RESET_EVENT: only signal events (`kfd_set_event`, `kfd_reset_event`).
    pub(super) fn set_event(&mut self, pid: u32, id: u32, set: bool, input: &[u8]) -> Outcome {
        let p = self.process_mut(pid);
        match p.events.get_mut(&id) {
            Some(ev) if ev.is_signal() => {
                ev.signaled = set;
                done(0, input)
            }
            _ => err(libc::EINVAL, input),
        }
    }

    /// A completed packet's mailbox named `event_id` (`set_event_from_interrupt`). Unknown ids
    /// are ignored, as the interrupt handler finds nothing to signal.
    pub fn signal_event(&mut self, pid: u32, event_id: u32) {
        if let Some(ev) = self
            .procs
            .get_mut(&pid)
            .and_then(|p| p.events.get_mut(&event_id))
        {
            ev.signaled = true;
        }
    }

    /// `kfd_wait_on_events`: returns at once when the condition holds or `timeout` is 0, else
    /// sleeps (interruptibly) until it holds or the timeout passes.
    pub(super) fn wait_events(
        &mut self,
        pid: u32,
        input: &[u8],
        host: &mut dyn Host,
        now: u64,
    ) -> Outcome {
        let a = WaitEventsArgs::from_bytes(input);
        if a.num_events > WAIT_MAX_EVENTS {
            return err(libc::EINVAL, input);
        }
        let size = std::mem::size_of::<EventData>();
        let mut raw = vec![0u8; a.num_events as usize * size];
        if host.read_mem(pid, a.events_ptr, &mut raw).is_err() {
            return err(libc::EFAULT, input);
        }
        let ids: Vec<u32> = raw
            .chunks_exact(size)
            .map(|c| EventData::from_bytes(c).event_id)
            .collect();
        let p = self.process_mut(pid);
        if ids.iter().any(|i| !p.events.contains_key(i)) {
            return err(libc::EINVAL, input);
        }
        let deadline = match a.timeout {
            u32::MAX => u64::MAX,
            ms => now + u64::from(ms) * 1_000_000,
        };
        let wait = Wait::Events {
            pid,
            ids,
            all: a.wait_for_all != 0,
            deadline,
            args: input.to_vec(),
        };
        match self.retry(&wait, now) {
            Some(o) => o,
            None if a.timeout == 0 => self.wait_result(input, WAIT_TIMEOUT),
            None => Outcome::Blocked(wait),
        }
    }

    /// Completes a WAIT_EVENTS whose condition holds (auto-reset events that satisfied it are
    /// reset) or whose deadline passed.
    pub(super) fn retry_events(
        &mut self,
        pid: u32,
        ids: &[u32],
        all: bool,
        deadline: u64,
        args: &[u8],
        now: u64,
    ) -> Option<Outcome> {
        let Some(p) = self.procs.get_mut(&pid) else {
            return Some(err(libc::EINVAL, args));
        };
        let signaled = |i: &u32| p.events.get(i).is_some_and(|e| e.signaled);
        let met = if all {
            ids.iter().all(signaled)
        } else {
            ids.iter().any(signaled)
        };
        if met {
            for i in ids {
                if let Some(ev) = p.events.get_mut(i) {
                    if ev.signaled && ev.auto_reset {
                        ev.signaled = false;
                    }
                }
            }
            return Some(self.wait_result(args, WAIT_COMPLETE));
        }
        if ids.iter().any(|i| !p.events.contains_key(i)) {
            // Destroyed while waited on: the kernel's waiter sees the event go away.
            return Some(err(libc::EINVAL, args));
        }
        (now >= deadline).then(|| self.wait_result(args, WAIT_TIMEOUT))
    }

    fn wait_result(&self, args: &[u8], result: u32) -> Outcome {
        let mut a = WaitEventsArgs::from_bytes(args);
        a.wait_result = result;
        done(0, a.as_bytes())
    }

    /// Reset events (`ResetEventArgs`) are plain ids; kept for symmetry with SET.
    pub(super) fn reset_event(&mut self, pid: u32, a: ResetEventArgs) -> Outcome {
        self.set_event(pid, a.event_id, false, a.as_bytes())
    }

    pub(super) fn set_event_ioctl(&mut self, pid: u32, a: SetEventArgs) -> Outcome {
        self.set_event(pid, a.event_id, true, a.as_bytes())
    }
}
