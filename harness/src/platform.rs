//! Every Linux-specific call the harness makes lives here (and only here): parent-death signal,
//! process groups and signals, liveness checks, `flock`, fd plumbing for the worker protocol,
//! and the `/dev/shm` sweep.
//!
//! # Shared-memory naming contract
//! Killed workers cannot clean up after themselves, so the runner sweeps `/dev/shm` after every
//! world teardown. Backends MUST therefore name every POSIX shared-memory object (and any other
//! file they create under `/dev/shm`) with a name that starts with [`shm_prefix`]`(world_id)`,
//! e.g. `shm_open("/" + shm_prefix(&info.world_id) + "ring0")`. Anything named that way is
//! removed by the runner when the world ends, in `/dev/shm` and in the temp dir
//! (`std::env::temp_dir()`, e.g. a socket); anything else is the backend's own problem.
//! Processes a rank starts inherit `CONCORD_WORLD_ID`; the runner kills those left at the world's
//! teardown ([`end_world_leftovers`]), so a helper must not clear its environment to hide.

use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The prefix every shared-memory name of world `world_id` MUST start with (the rule lives in
/// [`concord_core::world_prefix`], so backends need not depend on the runner).
pub fn shm_prefix(world_id: &str) -> String {
    concord_core::world_prefix(world_id)
}

/// Where POSIX shared memory lives on Linux.
pub const SHM_DIR: &str = "/dev/shm";

/// Removes every entry of `/dev/shm` whose name starts with [`shm_prefix`]`(world_id)`.
/// Returns the removed paths. Errors on individual entries are ignored (best effort).
pub fn sweep_shm(world_id: &str) -> Vec<PathBuf> {
    sweep_dir(Path::new(SHM_DIR), &shm_prefix(world_id))
}

/// The id of world `n` of this process's runner pool: `p<pid>n<ns>w<n>x<nonce>` (its files are
/// named with [`shm_prefix`] of it, so they carry the pid that owns them and that pid's
/// namespace: [`world_owner`]).
pub fn pool_world_id(n: u64) -> String {
    format!("p{}{}w{n}x{:06x}", std::process::id(), ns_part(), nonce())
}

/// The id of a world this process launches ([`crate::launch::launch`]): `l<pid>n<ns>x<nonce>`.
pub fn launch_world_id() -> String {
    format!("l{}{}x{:06x}", std::process::id(), ns_part(), nonce())
}

/// `n` and [`pid_ns_tag`] (empty where the namespace cannot be read: the id then has no tag).
fn ns_part() -> String {
    pid_ns_tag().map(|t| format!("n{t:06x}")).unwrap_or_default()
}

/// This process's pid namespace, as the low 24 bits of its inode (`/proc/self/ns/pid`, the
/// number in `pid:[4026531836]`); `None` where it cannot be read. A pid means something only in
/// its own namespace: two containers of one pod share `/dev/shm` but not their pids, so a world
/// of another namespace is never judged dead by its pid ([`sweep_dead_worlds_in`]).
pub fn pid_ns_tag() -> Option<u32> {
    static TAG: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| {
        let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let ino: u64 = link.to_str()?.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()?;
        Some((ino & 0xff_ffff) as u32)
    })
}

/// Who owns a world's file or dir: the pid, and its namespace tag where the name carries one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorldOwner {
    pub pid: u32,
    /// [`pid_ns_tag`] of the owner; `None` for a name made without one.
    pub ns: Option<u32>,
}

/// The owner of a world's file or dir named `name`, read from the world id it is named with
/// (`concord-p<pid>[n<ns>]w…` of [`pool_world_id`], `concord-l<pid>[n<ns>]x…` of
/// [`launch_world_id`]); `None` for any other name (a backend's unit tests, another tool's file).
pub fn world_owner(name: &str) -> Option<WorldOwner> {
    // `concord--` of an empty id: the world id follows the first dash.
    let lead = shm_prefix("");
    let rest = name.strip_prefix(lead.strip_suffix('-')?)?;
    let (kind, rest) = rest.split_at_checked(1)?;
    let end = rest.find(|c: char| !c.is_ascii_digit())?;
    let pid = rest[..end].parse::<u32>().ok().filter(|&p| p > 1 && p <= i32::MAX as u32)?;
    let mut after = &rest[end..];
    let mut ns = None;
    if let Some(tagged) = after.strip_prefix('n') {
        let hex = tagged.get(..6).filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))?;
        ns = Some(u32::from_str_radix(hex, 16).ok()?);
        after = &tagged[6..];
    }
    match (kind, after.chars().next()?) {
        ("p", 'w') | ("l", 'x') => Some(WorldOwner { pid, ns }),
        _ => None,
    }
}

/// Removes, from each of `dirs`, the world dirs and files (named `concord-p<pid>…` /
/// `concord-l<pid>…`, [`world_owner`]) of this user whose owning process is gone
/// (`kill(pid, 0)` is `ESRCH`): a parent SIGKILLed could not clean them, and nothing else
/// will. Never another user's entry, never one whose pid is alive (a zombie, or another user's
/// process, counts as alive), never one named in another pid namespace (its pid says nothing
/// here: a live world of a container sharing `/dev/shm`), never a symbolic link's target.
/// Returns the removed paths.
pub fn sweep_dead_worlds_in(dirs: &[&Path]) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let mut removed = Vec::new();
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(dir) else { continue };
        for e in rd.flatten() {
            let Some(owner) = e.file_name().to_str().and_then(world_owner) else { continue };
            if owner.ns.is_some() && owner.ns != pid_ns_tag() {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
            if m.uid() != me || pid_alive(owner.pid) {
                continue;
            }
            let p = e.path();
            let ok = if m.is_dir() { std::fs::remove_dir_all(&p).is_ok() } else { std::fs::remove_file(&p).is_ok() };
            if ok {
                removed.push(p);
            }
        }
    }
    removed
}

/// [`sweep_dead_worlds_in`] the temp dir (world dirs, sockets) and `/dev/shm` (segments), once
/// per process, when it makes its first world dir (the runner's pool and `launch::launch`).
pub fn sweep_dead_worlds_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        sweep_dead_worlds_in(&[&std::env::temp_dir(), Path::new(SHM_DIR)]);
    });
}

/// Removes every entry of `dir` whose file name starts with `prefix` (files and directories).
pub fn sweep_dir(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return removed };
    for e in rd.flatten() {
        if !e.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let p = e.path();
        let ok = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p).is_ok(),
            _ => std::fs::remove_file(&p).is_ok(),
        };
        if ok {
            removed.push(p);
        }
    }
    removed
}

/// Entries of `dir` whose name starts with `prefix` (for leak checks in tests).
pub fn list_prefixed(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).map(|e| e.path()).collect()
}

/// Configures `cmd` so that the child
/// * joins process group `pgid` (0: becomes the leader of a new group named after its pid), and
/// * receives SIGKILL when the *thread* that spawned it exits (`PR_SET_PDEATHSIG`); if the parent
///   is already gone by the time the child runs, the child refuses to exec.
///
/// Only async-signal-safe calls run between fork and exec.
pub fn configure_child(cmd: &mut Command, pgid: i32) {
    cmd.process_group(pgid);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only calls prctl and getppid, both async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::other("parent died before exec"));
            }
            Ok(())
        });
    }
}

/// Sends `sig` to every process of group `pgid`. `ESRCH` (group already empty) is not an error.
pub fn kill_group(pgid: i32, sig: nix::sys::signal::Signal) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("refusing to signal process group {pgid}")));
    }
    // SAFETY: plain syscall.
    let rc = unsafe { libc::killpg(pgid, sig as libc::c_int) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(e)
    }
}

/// Sends `sig` to process `pid`.
pub fn kill_pid(pid: u32, sig: nix::sys::signal::Signal) -> io::Result<()> {
    // SAFETY: plain syscall.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig as libc::c_int) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True while a process with this pid exists (a zombie still counts: it has not been reaped;
/// so does another user's process): `kill(pid, 0)` fails with anything but `ESRCH`, or succeeds.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) != Err(nix::errno::Errno::ESRCH)
}

/// True while a process with this pid exists and is not a zombie (a dead process that its
/// parent, or init for orphans, has not reaped yet).
pub fn pid_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself contain ')'.
        Ok(stat) => stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

/// The state letter of process `pid` from `/proc/<pid>/stat` (`R`, `S`, `D`, `T` stopped, `t`
/// stopped by a tracer, `Z` zombie), or `None` when it is gone.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).and_then(|s| s.chars().next())
}

/// SIGKILLs every process other than this one whose environment holds
/// `CONCORD_WORLD_ID=<world_id>` (what a world's ranks started: helpers, forked copies, daemons
/// in a session of their own, which the world's process group does not hold), and returns their
/// pids. Each match is pinned by a pidfd and its environment read again before the signal, so a
/// pid reused meanwhile is never signalled. Best effort: a process that cleared its environment,
/// whose environment this user cannot read, or that is in uninterruptible sleep when looked at,
/// is not found; without pidfds (Linux < 5.3) none is signalled.
pub fn kill_world_strays(world_id: &str) -> Vec<u32> {
    use std::os::fd::{AsRawFd, OwnedFd};
    let var = format!("{}={world_id}", crate::worker::vars::WORLD_ID);
    let holds =
        |pid: u32| std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == var.as_bytes()));
    let me = std::process::id();
    let mut killed = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return killed };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // A process in uninterruptible sleep (`D`, e.g. inside a device driver) is passed over:
        // reading its environment can block on its memory map's lock, and teardown must not.
        if pid == me || process_state(pid) == Some('D') || !holds(pid) {
            continue;
        }
        // SAFETY: plain syscall; a non-negative result is a fresh fd that we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            continue;
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if !holds(pid) {
            continue;
        }
        // SAFETY: plain syscall on the pidfd we own; no siginfo.
        let rc =
            unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<libc::siginfo_t>(), 0) };
        if rc == 0 {
            killed.push(pid);
        }
    }
    killed
}

/// True while process group `pgid` has a member (signal 0 reaches one).
pub fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks existence and permission.
    pgid > 1 && (unsafe { libc::killpg(pgid, 0) } == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// The last step of every world's teardown, once its ranks are reaped (or given up on): SIGKILL
/// what is left of its process group (processes the ranks started), then, when `scan` or when
/// the group still had members, its strays outside the group ([`kill_world_strays`]: a read of
/// every process's environment, milliseconds, so only on evidence), then its files: every entry
/// of the temp dir and of `/dev/shm` named with [`shm_prefix`]`(world_id)` (the world's own temp
/// dir among them). Returns the pids of the strays killed.
pub fn end_world_leftovers(pgid: i32, world_id: &str, scan: bool) -> Vec<u32> {
    let group_left = group_alive(pgid);
    if group_left {
        let _ = kill_group(pgid, nix::sys::signal::Signal::SIGKILL);
    }
    let strays = if scan || group_left { kill_world_strays(world_id) } else { Vec::new() };
    sweep_dir(&std::env::temp_dir(), &shm_prefix(world_id));
    sweep_shm(world_id);
    strays
}

/// Files a backend's own library creates in `/dev/shm` under names Concord does not choose
/// (NCCL: `/dev/shm/nccl-XXXXXX`, from `mkstemp`, with no setting to change the name), which its
/// processes leave behind when they are killed before they unlink them. A backend declares their
/// name prefixes ([`crate::runner::WorldKey::foreign_shm`]); the runner takes a snapshot of the
/// entries with those prefixes before it spawns a world and, once the world's processes are
/// reaped, removes the entries that are new since the snapshot, owned by this user, and neither
/// open nor mapped by any live process (`/proc/*/fd`, `/proc/*/maps`): another job's live
/// segment is kept, and so is anything that existed before the world. The rule a declared prefix
/// relies on: a file of it is open or mapped by a process for as long as it is in use (NCCL's are:
/// the creator keeps its fd until it closes the segment, and every user maps it).
#[derive(Clone, Debug)]
pub struct ForeignShm {
    dir: PathBuf,
    prefixes: Vec<String>,
    /// (name, inode) of every prefixed entry before the world was spawned.
    before: std::collections::HashSet<(std::ffi::OsString, u64)>,
}

/// What [`ForeignShm::sweep`] did.
#[derive(Clone, Debug, Default)]
pub struct ForeignSweep {
    /// Removed: new since the snapshot, ours, held by no live process.
    pub removed: Vec<PathBuf>,
    /// New since the snapshot and ours, but open or mapped by a live process: kept.
    pub held: Vec<PathBuf>,
    /// Not decided: a process of this user could not be read (uninterruptible sleep), so the
    /// candidates were kept.
    pub undecided: Vec<PathBuf>,
}

impl ForeignShm {
    /// The snapshot of `/dev/shm`; `None` when there is no prefix to watch.
    pub fn snapshot(prefixes: &[String]) -> Option<ForeignShm> {
        ForeignShm::snapshot_in(Path::new(SHM_DIR), prefixes)
    }

    /// The snapshot of `dir` (tests use a directory of their own).
    pub fn snapshot_in(dir: &Path, prefixes: &[String]) -> Option<ForeignShm> {
        let prefixes: Vec<String> = prefixes.iter().filter(|p| !p.is_empty()).cloned().collect();
        if prefixes.is_empty() {
            return None;
        }
        let mut f = ForeignShm { dir: dir.to_path_buf(), prefixes, before: Default::default() };
        f.before = f.entries().into_iter().map(|(p, ino, _)| (p.file_name().unwrap_or_default().to_os_string(), ino)).collect();
        Some(f)
    }

    /// Prefixed regular files of the directory: (path, inode, owner).
    fn entries(&self) -> Vec<(PathBuf, u64, u32)> {
        use std::os::unix::fs::MetadataExt;
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        rd.flatten()
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                self.prefixes.iter().any(|p| n.starts_with(p.as_str()))
            })
            .filter_map(|e| {
                let m = std::fs::symlink_metadata(e.path()).ok()?;
                m.file_type().is_file().then(|| (e.path(), m.ino(), m.uid()))
            })
            .collect()
    }

    /// Removes what the world's processes left (see the type's doc) and says what it kept.
    /// Processes of the world that are still exiting (SIGKILLed, not yet gone) may still map a
    /// file: it is looked at again for up to `settle`.
    pub fn sweep(&self, settle: std::time::Duration) -> ForeignSweep {
        let until = std::time::Instant::now() + settle;
        loop {
            let out = self.sweep_once();
            if out.held.is_empty() && out.undecided.is_empty() || std::time::Instant::now() >= until {
                return out;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn sweep_once(&self) -> ForeignSweep {
        // SAFETY: plain syscall.
        let me = unsafe { libc::geteuid() };
        let candidates: Vec<(PathBuf, u64)> = self
            .entries()
            .into_iter()
            .filter(|(p, ino, uid)| *uid == me && !self.before.contains(&(p.file_name().unwrap_or_default().to_os_string(), *ino)))
            .map(|(p, ino, _)| (p, ino))
            .collect();
        let mut out = ForeignSweep::default();
        if candidates.is_empty() {
            return out;
        }
        let (held, complete) = held_inodes(&self.dir);
        for (p, ino) in candidates {
            if held.contains(&ino) {
                out.held.push(p);
            } else if !complete {
                out.undecided.push(p);
            } else if std::fs::remove_file(&p).is_ok() {
                out.removed.push(p);
            }
        }
        out
    }
}

/// Inodes of files under `dir` that a live process holds open (`/proc/<pid>/fd`) or mapped
/// (`/proc/<pid>/maps`), and whether every process of this user could be read (one in
/// uninterruptible sleep is not: reading its maps could block on its memory map's lock).
/// Processes of other users cannot be read and are not counted: only this user's files are
/// candidates, and another user's process holds one only if this user made it readable to them.
fn held_inodes(dir: &Path) -> (std::collections::HashSet<u64>, bool) {
    use std::os::unix::fs::MetadataExt;
    let mut held = std::collections::HashSet::new();
    let mut complete = true;
    let dir_s = dir.to_string_lossy().into_owned();
    let dir_slash = format!("{}/", dir_s.trim_end_matches('/'));
    // SAFETY: plain syscall.
    let me_uid = unsafe { libc::geteuid() };
    let Ok(rd) = std::fs::read_dir("/proc") else { return (held, false) };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let ours = std::fs::metadata(e.path()).is_ok_and(|m| m.uid() == me_uid);
        if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            for fd in fds.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else { continue };
                if target.to_string_lossy().starts_with(&dir_slash) {
                    // The link's own target may be gone (` (deleted)`); stat through the fd.
                    if let Ok(m) = std::fs::metadata(fd.path()) {
                        held.insert(m.ino());
                    }
                }
            }
        }
        match process_state(pid) {
            Some('D') => {
                if ours {
                    complete = false;
                }
                continue;
            }
            None | Some('Z' | 'X') => continue,
            _ => {}
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { continue };
        for line in maps.lines().filter(|l| l.contains(dir_slash.as_str())) {
            // `address perms offset dev inode path`
            if let Some(ino) = line.split_whitespace().nth(4).and_then(|i| i.parse::<u64>().ok()) {
                held.insert(ino);
            }
        }
    }
    (held, complete)
}

/// Name of a signal number: `SIGSEGV`, or `signal 77` when unknown.
pub fn signal_name(sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("signal {sig}"),
    }
}

/// How a process ended: `exit code 3`, `killed by signal SIGSEGV (core dumped)`.
pub fn describe_exit(s: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = s.signal() {
        let core = if s.core_dumped() { " (core dumped)" } else { "" };
        format!("killed by signal {}{core}", signal_name(sig))
    } else {
        format!("exit code {}", s.code().unwrap_or(-1))
    }
}

/// Worker side: returns a private duplicate of the original stdout (the protocol channel to the
/// parent) and points fd 1 at stderr, so stray `println!` from user code lands in the captured
/// stderr instead of corrupting the protocol.
pub fn take_protocol_stdout() -> io::Result<File> {
    std::io::Write::flush(&mut std::io::stdout())?;
    // SAFETY: plain syscalls on the process's own standard fds; the dup'd fd is owned by the File.
    unsafe {
        let fd = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::dup2(2, 1) < 0 {
            let e = io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok(File::from_raw_fd(fd))
    }
}

/// CPU time (user + sys) of `who`: `RUSAGE_SELF` (every thread of this process, reaped children
/// not included) or `RUSAGE_THREAD` (the calling thread). Zero if the call fails.
fn cpu_time(who: libc::c_int) -> std::time::Duration {
    // SAFETY: `rusage` is plain integers (all-zero is a valid value); getrusage writes one
    // into the value it is given, which lives for the call.
    let (rc, u) = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        (libc::getrusage(who, &mut u), u)
    };
    if rc != 0 {
        return std::time::Duration::ZERO;
    }
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// This process's CPU time so far, every thread (`CONCORD_CASE_CPU`'s measure of a rank).
pub fn process_cpu_time() -> std::time::Duration {
    cpu_time(libc::RUSAGE_SELF)
}

/// The calling thread's CPU time so far (`CONCORD_CASE_CPU`'s measure of a runner's lane).
pub fn thread_cpu_time() -> std::time::Duration {
    cpu_time(libc::RUSAGE_THREAD)
}

/// Ends the process at once, without running atexit handlers or destructors (used by the worker's
/// stdin watchdog when the parent has gone away).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is async-signal-safe.
    unsafe { libc::_exit(code) }
}

// ---------------------------------------------------------------------------------------------
// Termination cleanup (parent side)

static TERM_PIPE_WRITE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_termination_signal(sig: libc::c_int) {
    let fd = TERM_PIPE_WRITE.load(std::sync::atomic::Ordering::SeqCst);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; `b` lives for the call. errno is saved and
        // restored so that the interrupted code does not see the handler's errno.
        unsafe {
            let saved = *libc::__errno_location();
            libc::write(fd, &b as *const u8 as *const libc::c_void, 1);
            *libc::__errno_location() = saved;
        }
    }
}

/// Installs (once per process) handlers for SIGTERM, SIGINT and SIGHUP that run `cleanup` on a
/// normal thread (self-pipe; nothing but `write` runs in the handler) and then exit with
/// `128 + signal`. The runner uses it so that a parent killed by nextest's timeout or by ^C
/// still kills its worlds and removes their files.
pub fn install_termination_cleanup(cleanup: fn()) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return;
        }
        // SAFETY: fds[0] is a fresh pipe read end owned by nobody else.
        let mut read_end = unsafe { File::from_raw_fd(fds[0]) };
        TERM_PIPE_WRITE.store(fds[1], std::sync::atomic::Ordering::SeqCst);
        let spawned = std::thread::Builder::new().name("concord-term".into()).spawn(move || {
            use std::io::Read;
            let mut b = [0u8; 1];
            if read_end.read_exact(&mut b).is_ok() {
                cleanup();
                exit_now(128 + b[0] as i32);
            }
        });
        if spawned.is_err() {
            return;
        }
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            // SAFETY: installing a handler that only calls write(2).
            unsafe {
                libc::signal(sig, on_termination_signal as *const () as libc::sighandler_t);
            }
        }
    });
}

/// A short random-enough suffix (time and address entropy) so that world ids stay unique even
/// when a pid is reused by a later process and an earlier one left files behind.
pub fn nonce() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let local = 0u8;
    let addr = &local as *const u8 as usize as u32;
    (t ^ addr.rotate_left(13) ^ std::process::id().rotate_left(7)) & 0xff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_prefix_is_delimited() {
        assert_eq!(shm_prefix("p1w1"), "concord-p1w1-");
        assert!(!format!("{}x", shm_prefix("p1w10")).starts_with(&shm_prefix("p1w1")));
    }

    #[test]
    fn sweep_removes_only_prefixed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("concord-a-1"), b"x").unwrap();
        std::fs::create_dir(d.path().join("concord-a-dir")).unwrap();
        std::fs::write(d.path().join("concord-ab-1"), b"x").unwrap();
        let removed = sweep_dir(d.path(), "concord-a-");
        assert_eq!(removed.len(), 2);
        assert!(d.path().join("concord-ab-1").exists());
    }

    #[test]
    fn world_owner_reads_the_pid_of_both_id_kinds() {
        let me = WorldOwner { pid: std::process::id(), ns: pid_ns_tag() };
        assert!(me.ns.is_some(), "Linux names every pid namespace in /proc/self/ns/pid");
        assert_eq!(world_owner(&format!("{}Ab12cd", shm_prefix(&pool_world_id(7)))), Some(me));
        assert_eq!(world_owner(&format!("{}ring0", shm_prefix(&launch_world_id()))), Some(me));
        // Names made without a namespace tag (an older runner's) still name their pid.
        assert_eq!(world_owner("concord-p12w3x00abcd-a"), Some(WorldOwner { pid: 12, ns: None }));
        assert_eq!(world_owner("concord-l12n0a0b0cx00abcd-a"), Some(WorldOwner { pid: 12, ns: Some(0x0a0b0c) }));
        for other in [
            "concord-p12n0a0b0w3x1-a",
            "concord-p12nzz0b0cw3x1-a",
            "concord-p12n0a0b0cx3-a",
            "concord-l12n0a0b0cw3-a",
            "concord-unit-arena-12",
            "concord-p12",
            "concord-p12x3-a",
            "concord-l12w3-a",
            "concord-pw1x2-a",
            "concord-p1w2x3-a",
            "nccl-p12w3",
        ] {
            assert_eq!(world_owner(other), None, "{other}");
        }
    }

    /// A pid no process has: a child run to its end and reaped.
    fn dead_pid() -> u32 {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!pid_alive(pid));
        pid
    }

    #[test]
    fn dead_worlds_are_swept_live_and_foreign_ones_kept() {
        let (tmp, shm) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let dead = dead_pid();
        /// A live process, ended (and reaped) however the test ends.
        struct Live(std::process::Child);
        impl Drop for Live {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let live = Live(Command::new("sleep").arg("1000").spawn().unwrap());
        let live_pid = live.0.id();
        let make_dir = |name: String| {
            let p = tmp.path().join(name);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("store"), b"x").unwrap();
            p
        };
        let make_file = |name: String| {
            let p = shm.path().join(name);
            std::fs::write(&p, b"x").unwrap();
            p
        };
        let ns = pid_ns_tag().expect("this process's pid namespace");
        let elsewhere = ns ^ 0x80_0001;
        let gone = [
            make_dir(format!("concord-p{dead}w0x00abcd-Q1w2e3")),
            make_dir(format!("concord-l{dead}x00abcd-R4t5y6")),
            make_file(format!("concord-p{dead}w3x00abcd-ring0")),
            make_dir(format!("concord-p{dead}n{ns:06x}w4x00abcd-Q1w2e3")),
            make_file(format!("concord-l{dead}n{ns:06x}x00abcd-ring0")),
        ];
        let kept = [
            // Another pid namespace's world (a container sharing /dev/shm): its pid means
            // nothing here, dead-looking or not.
            make_dir(format!("concord-p{dead}n{elsewhere:06x}w5x00abcd-Q1w2e3")),
            make_file(format!("concord-l{dead}n{elsewhere:06x}x00abcd-ring0")),
            make_file(format!("concord-p{live_pid}n{ns:06x}w6x00abcd-ring0")),
            make_dir(format!("concord-p{live_pid}w0x00abcd-Z9x8c7")),
            make_dir(format!("concord-p{}w1x00abcd-Z9x8c7", std::process::id())),
            make_file(format!("concord-l{live_pid}x00abcd-ring0")),
            make_dir(format!("concord-unit-{dead}")),
            make_file(format!("nccl-{dead}")),
        ];
        // Another user's world of a dead pid: not ours to remove (only where we may chown).
        let foreign = make_dir(format!("concord-p{dead}w9x00abcd-Other1"));
        let chowned = nix::unistd::chown(&foreign, Some(nix::unistd::Uid::from_raw(65534)), None).is_ok();
        let mut removed = sweep_dead_worlds_in(&[tmp.path(), shm.path()]);
        removed.sort();
        let mut want = gone.to_vec();
        if !chowned {
            want.push(foreign.clone());
        }
        want.sort();
        assert_eq!(removed, want);
        for p in &gone {
            assert!(!p.exists(), "{} of dead pid {dead} left", p.display());
        }
        for p in &kept {
            assert!(p.exists(), "{} removed", p.display());
        }
        assert_eq!(foreign.exists(), chowned, "another user's world dir");
        drop(live);
    }

    #[test]
    fn strays_are_found_by_their_world_id_in_any_session() {
        use std::os::unix::process::CommandExt;
        let id = format!("strays{:06x}", nonce());
        let spawn = |world: &str| {
            let mut cmd = Command::new("sleep");
            cmd.arg("1000").env(crate::worker::vars::WORLD_ID, world).process_group(0);
            cmd.spawn().unwrap()
        };
        let mut mine = spawn(&id);
        // A world whose id merely starts with this one's is another world.
        let mut other = spawn(&format!("{id}0"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut killed = Vec::new();
        // The child's environment is readable once it has exec'd.
        while killed.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
            killed = kill_world_strays(&id);
        }
        assert_eq!(killed, vec![mine.id()]);
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&mine.wait().unwrap()), Some(libc::SIGKILL));
        assert!(other.try_wait().unwrap().is_none(), "another world's process was signalled");
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(kill_world_strays(&id).is_empty());
    }

    #[test]
    fn process_state_of_a_stopped_child() {
        let mut c = Command::new("sleep").arg("1000").spawn().unwrap();
        kill_pid(c.id(), nix::sys::signal::Signal::SIGSTOP).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while process_state(c.id()) != Some('T') && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(process_state(c.id()), Some('T'));
        c.kill().unwrap();
        c.wait().unwrap();
        assert_eq!(process_state(c.id()), None);
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(11), "SIGSEGV");
        assert_eq!(signal_name(1000), "signal 1000");
    }

    #[test]
    fn liveness() {
        assert!(pid_alive(std::process::id()));
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while pid_running(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!pid_running(pid), "exited child is a zombie, not running");
        assert!(pid_alive(pid), "zombie still counts as alive until reaped");
        c.wait().unwrap();
        assert!(!pid_alive(pid));
        assert!(pid_running(std::process::id()));
    }
}

// ---------------------------------------------------------------------------------------------
// Stderr tail (externally launched ranks)

/// The last bytes this process wrote to stderr, kept while they still go to the real stderr.
#[derive(Clone)]
pub struct StderrTail {
    buf: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<u8>>>,
    cap: usize,
    /// The real stderr (a duplicate).
    real: std::sync::Arc<File>,
    /// Held by the copier thread from its read of a chunk until the chunk is written out (and
    /// kept): while it is free and the pipe is empty, everything written so far is out.
    copying: std::sync::Arc<std::sync::Mutex<()>>,
}

impl StderrTail {
    /// The tail as text (lossy UTF-8), starting at a line boundary when there is one.
    pub fn text(&self) -> String {
        let b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let v: Vec<u8> = b.iter().copied().collect();
        let s = String::from_utf8_lossy(&v).into_owned();
        match (b.len() >= self.cap, s.find('\n')) {
            (true, Some(i)) => s[i + 1..].to_string(),
            _ => s,
        }
    }

    /// Writes `text` to the real stderr directly (bypassing the copier), for the last words of
    /// a process that is about to end at once.
    pub fn write_direct(&self, text: &str) {
        let _ = std::io::Write::write_all(&mut &*self.real, text.as_bytes());
    }

    /// Waits (up to `within`) until the copier has passed everything written so far to the
    /// real stderr: the pipe is empty AND the copier holds no chunk (it reads and writes each
    /// chunk under `copying`; an empty pipe alone may mean the last chunk, the process's last
    /// words, is read but not yet written). `true` once all is out; `false` at the deadline
    /// (the real stderr is not being read, say).
    pub fn flush(&self, within: std::time::Duration) -> bool {
        let _ = std::io::Write::flush(&mut std::io::stderr());
        let deadline = std::time::Instant::now() + within;
        loop {
            let fd = PIPE_READ.load(std::sync::atomic::Ordering::SeqCst);
            if fd < 0 {
                return true;
            }
            // Never blocks: a copier stuck writing to the real stderr holds the lock.
            if let Ok(_idle) = self.copying.try_lock() {
                let mut pending: libc::c_int = 0;
                // SAFETY: FIONREAD on our own pipe's read end, whose fd the copier owns for the
                // process's lifetime (PIPE_READ).
                if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut pending) } != 0 || pending == 0 {
                    return true;
                }
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

static PIPE_READ: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Points fd 2 at a pipe whose reader copies everything to the original stderr and keeps the
/// last `cap` bytes ([`StderrTail`]). Once per process (a second call returns the first tail).
pub fn tee_stderr(cap: usize) -> io::Result<StderrTail> {
    static TAIL: std::sync::OnceLock<StderrTail> = std::sync::OnceLock::new();
    if let Some(t) = TAIL.get() {
        return Ok(t.clone());
    }
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: plain syscalls on fds this function creates; the originals are duplicated before
    // fd 2 is replaced, and every fd ends up owned by exactly one File.
    let (real, read) = unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        let real = libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3);
        if real < 0 {
            let e = io::Error::last_os_error();
            libc::close(fds[0]);
            libc::close(fds[1]);
            return Err(e);
        }
        if libc::dup2(fds[1], 2) < 0 {
            let e = io::Error::last_os_error();
            libc::close(fds[0]);
            libc::close(fds[1]);
            libc::close(real);
            return Err(e);
        }
        libc::close(fds[1]);
        (File::from_raw_fd(real), File::from_raw_fd(fds[0]))
    };
    PIPE_READ.store(std::os::fd::AsRawFd::as_raw_fd(&read), std::sync::atomic::Ordering::SeqCst);
    let tail = StderrTail { buf: Default::default(), cap, real: std::sync::Arc::new(real), copying: Default::default() };
    let t = tail.clone();
    std::thread::Builder::new().name("concord-stderr-tee".into()).spawn(move || {
        let mut read = read;
        let mut chunk = [0u8; 4096];
        loop {
            // Sleep until there is something to read, outside the lock; then read and write the
            // chunk under it (see `StderrTail::flush`). Only this thread reads the pipe, so the
            // read finds the bytes poll saw.
            let mut fds = [libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(&read), events: libc::POLLIN, revents: 0 }];
            // SAFETY: poll on one valid pollfd of our own pipe.
            if unsafe { libc::poll(fds.as_mut_ptr(), 1, -1) } < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            let _copying = t.copying.lock().unwrap_or_else(|e| e.into_inner());
            match std::io::Read::read(&mut read, &mut chunk) {
                Ok(0) => return,
                Ok(n) => {
                    let _ = std::io::Write::write_all(&mut &*t.real, &chunk[..n]);
                    let mut b = t.buf.lock().unwrap_or_else(|e| e.into_inner());
                    b.extend(&chunk[..n]);
                    let over = b.len().saturating_sub(t.cap);
                    b.drain(..over);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    })?;
    let _ = TAIL.set(tail.clone());
    Ok(TAIL.get().cloned().unwrap_or(tail))
}
