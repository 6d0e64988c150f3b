//! Descriptors this process inherited stay out of the processes it starts.
//!
//! A program that starts the gateway (a shell, a supervisor, a container runtime's shim) may
//! leave descriptors open without close-on-exec: a listening socket, a log file, a pipe. Rust
//! opens everything of its own with `O_CLOEXEC`, but a descriptor that was already open when
//! the process started keeps whatever flag its opener gave it, and every stdio legacy server
//! (`upstream.transport = "stdio"`) would inherit it: a child could write to the gateway's
//! supervisor's files or keep one of its sockets alive.
//!
//! [`keep_from_children`] marks every descriptor from 3 up close-on-exec once, when `serve`
//! starts. The descriptors stay open and usable in the gateway; they only no longer survive an
//! `exec`. Children then get exactly stdin, stdout and stderr (the pipes the stdio transport
//! sets up). Setting a flag cannot invalidate a descriptor, so the `close_fds` crate offers it
//! as a safe function (Linux: one `close_range(CLOSE_RANGE_CLOEXEC)` call, or a walk of
//! `/proc/self/fd` on older kernels); this crate keeps `#![forbid(unsafe_code)]`.

/// The lowest descriptor marked: 0, 1 and 2 are the gateway's own standard streams.
pub const FIRST_MARKED_FD: i32 = 3;

/// Marks every descriptor from [`FIRST_MARKED_FD`] up close-on-exec. Safe to call while other
/// threads run (the thread-safe variant is used); idempotent.
pub fn keep_from_children() {
    close_fds::set_fds_cloexec_threadsafe(FIRST_MARKED_FD, &[]);
}
