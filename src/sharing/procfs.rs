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
    fn root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/proc"), Path::new("/")));
    }
}
