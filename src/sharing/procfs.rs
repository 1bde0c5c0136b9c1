//! Process and mount facts read from procfs.

use std::path::Path;

/// Whether `pid` runs (exists and is not a zombie). The MPS daemon is not our child (it
/// detaches), so when it dies it may linger as a zombie of whoever adopted it.
pub fn process_alive(proc_root: &Path, pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else {
        return false;
    };
    // The state letter follows the last ')' (the command name may contain ')').
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X" | "x") | None)
}

/// Whether `pid` is a live MPS daemon of `pipe_dir`: alive, a process (not a thread of
/// another one: `Tgid` equals the pid), and started with `CUDA_MPS_PIPE_DIRECTORY=<pipe_dir>`.
/// A pid file outlives its process and pids are reused (after a container restart they even
/// belong to another namespace), so a bare pid is never enough to signal a process.
pub fn daemon_alive(proc_root: &Path, pid: u32, pipe_dir: &Path) -> bool {
    if !process_alive(proc_root, pid) {
        return false;
    }
    let dir = proc_root.join(pid.to_string());
    let is_process = std::fs::read_to_string(dir.join("status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
        == Some(pid);
    let want = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe_dir.display());
    let ours = std::fs::read(dir.join("environ"))
        .map(|env| env.split(|b| *b == 0).any(|var| var == want.as_bytes()))
        .unwrap_or(false);
    is_process && ours
}

/// Reads a pid file: one decimal number, surrounding whitespace ignored.
pub fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether `dir` is a mount point according to `<proc_root>/self/mountinfo`.
pub fn is_mount_point(proc_root: &Path, dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string(proc_root.join("self/mountinfo")) else {
        return false;
    };
    let want = escape(&dir.to_string_lossy());
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mount_point| mount_point == want)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn escape(path: &str) -> String {
    path.replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_made_up_pid_is_not() {
        let proc_root = Path::new("/proc");
        assert!(process_alive(proc_root, std::process::id()));
        assert!(!process_alive(proc_root, u32::MAX));
    }

    #[test]
    fn zombie_state_counts_as_dead() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("7")).unwrap();
        std::fs::write(tmp.path().join("7/stat"), "7 (a) b) Z 1 7").unwrap();
        assert!(!process_alive(tmp.path(), 7));
        std::fs::write(tmp.path().join("7/stat"), "7 (a) b) S 1 7").unwrap();
        assert!(process_alive(tmp.path(), 7));
    }

    #[test]
    fn a_pid_is_a_daemon_only_with_its_pipe_directory_in_its_environment() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("9");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stat"), "9 (nvidia-cuda-mps) S 1 9").unwrap();
        std::fs::write(dir.join("status"), "Name:\tx\nTgid:\t9\nPid:\t9\n").unwrap();
        std::fs::write(
            dir.join("environ"),
            b"A=1\0CUDA_MPS_PIPE_DIRECTORY=/p/a/pipe\0",
        )
        .unwrap();
        assert!(daemon_alive(tmp.path(), 9, Path::new("/p/a/pipe")));
        assert!(
            !daemon_alive(tmp.path(), 9, Path::new("/p/b/pipe")),
            "another daemon's pid"
        );
        std::fs::write(dir.join("status"), "Name:\tx\nTgid:\t4\nPid:\t9\n").unwrap();
        assert!(
            !daemon_alive(tmp.path(), 9, Path::new("/p/a/pipe")),
            "a thread"
        );
        assert!(!daemon_alive(
            Path::new("/proc"),
            std::process::id(),
            Path::new("/p/a/pipe")
        ));
    }

    #[test]
    fn root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/proc"), Path::new("/")));
    }
}
