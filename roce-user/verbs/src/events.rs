//! Asynchronous events (`ibv_get_async_event`): the queue behind a context's `async_fd`, and
//! the link watch that raises the port events.
//!
//! The fd is an eventfd used as a level: it is readable exactly while an event waits (its
//! counter is 1 from the push onto an empty queue to the pop that empties it, both under the
//! queue's lock), so `poll`/`epoll` on `async_fd` report what `ibv_get_async_event` would
//! return, and an event withdrawn because its object was destroyed leaves no stale readiness.
//! `ibv_get_async_event` blocks (in `poll(2)`) unless the program made the fd non-blocking,
//! as with rdma-core's uverbs event file.

use core::ffi::c_int;
use std::{
    collections::VecDeque,
    os::fd::{AsFd as _, AsRawFd as _, RawFd},
    sync::{Mutex, PoisonError},
};

use nix::{
    fcntl::{FcntlArg, OFlag, fcntl},
    poll::{PollFd, PollFlags, PollTimeout, poll},
    sys::eventfd::{EfdFlags, EventFd},
};

/// What an event is about (`ibv_async_event.element`); objects by the address of their C
/// struct, kept as a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// A `struct ibv_qp`.
    Qp(usize),
    /// A `struct ibv_cq`.
    Cq(usize),
    /// A `struct ibv_srq`.
    Srq(usize),
    /// A port number.
    Port(c_int),
}

/// One event: its `enum ibv_event_type` code and its element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// `IBV_EVENT_*`.
    pub kind: u32,
    /// The object or port.
    pub element: Element,
}

/// The events of a context, and the fd that says whether one waits.
#[derive(Debug)]
pub struct AsyncEvents {
    fd: EventFd,
    queue: Mutex<VecDeque<AsyncEvent>>,
}

impl AsyncEvents {
    /// An empty queue with its fd (blocking, close-on-exec).
    ///
    /// # Errors
    /// The errno of `eventfd(2)`.
    pub fn new() -> Result<Self, c_int> {
        let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC).map_err(|e| e as c_int)?;
        Ok(Self {
            fd,
            queue: Mutex::new(VecDeque::new()),
        })
    }

    /// The fd programs poll (`ibv_context.async_fd`).
    #[must_use]
    pub fn fd(&self) -> RawFd {
        self.fd.as_fd().as_raw_fd()
    }

    /// Queues an event and makes the fd readable.
    pub fn push(&self, e: AsyncEvent) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if q.is_empty() {
            let _ = self.fd.write(1);
        }
        q.push_back(e);
    }

    /// Takes the oldest event, clearing the fd when it was the last. The counter is 1 while
    /// the queue is not empty, so the read does not block.
    fn pop(&self) -> Option<AsyncEvent> {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let e = q.pop_front()?;
        if q.is_empty() {
            let _ = self.fd.read();
        }
        Some(e)
    }

    /// The next event (`ibv_get_async_event`): waits for one unless the program made the fd
    /// non-blocking.
    ///
    /// # Errors
    /// `EAGAIN` on a non-blocking fd with no event; the errno of `poll(2)` or `fcntl(2)`.
    pub fn next(&self) -> Result<AsyncEvent, c_int> {
        loop {
            if let Some(e) = self.pop() {
                return Ok(e);
            }
            let flags = fcntl(self.fd.as_fd(), FcntlArg::F_GETFL).map_err(|e| e as c_int)?;
            if OFlag::from_bits_truncate(flags).contains(OFlag::O_NONBLOCK) {
                return Err(libc::EAGAIN);
            }
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e as c_int),
            }
        }
    }

    /// Withdraws the events about `element` (its object is being destroyed, and C must not
    /// be handed its address afterwards).
    pub fn forget(&self, element: Element) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let had = !q.is_empty();
        q.retain(|e| e.element != element);
        if had && q.is_empty() {
            let _ = self.fd.read();
        }
    }

    /// Events waiting.
    #[must_use]
    pub fn len(&self) -> usize {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no event waits.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(ev: &AsyncEvents) -> bool {
        let mut fds = [PollFd::new(ev.fd.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
    }

    #[test]
    fn the_fd_is_readable_exactly_while_an_event_waits() {
        let ev = AsyncEvents::new().unwrap();
        assert!(!readable(&ev));
        let a = AsyncEvent {
            kind: 1,
            element: Element::Qp(0x10),
        };
        let b = AsyncEvent {
            kind: 2,
            element: Element::Srq(0x20),
        };
        ev.push(a);
        ev.push(b);
        assert!(readable(&ev));
        assert_eq!(ev.next(), Ok(a));
        assert!(readable(&ev));
        assert_eq!(ev.next(), Ok(b));
        assert!(!readable(&ev));
        // A withdrawn event leaves nothing behind.
        ev.push(a);
        ev.forget(Element::Qp(0x10));
        assert!(!readable(&ev));
        assert!(ev.is_empty());
        // Non-blocking: EAGAIN instead of waiting.
        fcntl(ev.fd.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        assert_eq!(ev.next(), Err(libc::EAGAIN));
    }
}
