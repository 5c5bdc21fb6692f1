//! A reader that closes the program's stdout early (`concord-bench ... | head`, `--list | grep -q`)
//! ends the program quietly, as SIGPIPE ends a C program, instead of with a panic and a backtrace.
//!
//! Rust ignores SIGPIPE, so the next `println!` after the reader left panics ("failed printing to
//! stdout: Broken pipe"; libtest-mimic's list printer unwraps the same error). Restoring the
//! signal's default would end the process on the spot, before the destructors that end the ranks
//! and remove their files; so the panic stays, unwinds `main` (those destructors run), and
//! [`main_quiet_on_broken_pipe`] turns it into exit status 141 (128 + SIGPIPE) with nothing
//! printed. Other panics are printed and propagate as before.

use std::any::Any;
use std::panic::UnwindSafe;

/// Exit status for a program whose stdout reader went away (the shell's status for SIGPIPE).
pub const BROKEN_PIPE_EXIT: i32 = 141;

/// Whether a panic payload is a failed write to a closed pipe.
pub fn is_broken_pipe(payload: &(dyn Any + Send)) -> bool {
    let s = payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied()).unwrap_or("");
    s.contains("Broken pipe") || s.contains("BrokenPipe")
}

/// Runs `main`; a broken-pipe panic on the main thread is not printed, and once it has unwound
/// `main` the process exits with [`BROKEN_PIPE_EXIT`].
pub fn main_quiet_on_broken_pipe<T>(main: impl FnOnce() -> T + UnwindSafe) -> T {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("main") && is_broken_pipe(info.payload()) {
            return;
        }
        default(info)
    }));
    match std::panic::catch_unwind(main) {
        Ok(v) => v,
        Err(p) if is_broken_pipe(&*p) => std::process::exit(BROKEN_PIPE_EXIT),
        Err(p) => std::panic::resume_unwind(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_two_broken_pipe_panics() {
        let println = String::from("failed printing to stdout: Broken pipe (os error 32)");
        let libtest =
            String::from("called `Result::unwrap()` on an `Err` value: Os { code: 32, kind: BrokenPipe, message: \"Broken pipe\" }");
        assert!(is_broken_pipe(&println));
        assert!(is_broken_pipe(&libtest));
        assert!(!is_broken_pipe(&String::from("index out of bounds")));
        assert!(!is_broken_pipe(&"assertion failed"));
        assert_eq!(main_quiet_on_broken_pipe(|| 7), 7);
    }
}
