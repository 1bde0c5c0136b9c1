//! The MPS control daemon's command lines, its directories, and the control protocol
//! (commands on the stdin of `nvidia-cuda-mps-control`, answers on its stdout).

use std::path::{Path, PathBuf};

use super::commands::{CommandLine, MULTI_USER_FLAG, SHM_SCRIPT, SHM_SCRIPT_MULTI_USER, path_str};
use super::exec;
use super::spec::MpsDaemonSpec;
use super::{SharingError, Tools};

/// The per-daemon directories under the manager's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DaemonDirs {
    pub base: PathBuf,
    pub pipe: PathBuf,
    pub log: PathBuf,
    pub shm: PathBuf,
    pub spec: PathBuf,
}

impl DaemonDirs {
    pub fn new(root: &Path, id: &str) -> DaemonDirs {
        let base = root.join(id);
        DaemonDirs {
            pipe: base.join("pipe"),
            log: base.join("log"),
            shm: base.join("shm"),
            spec: base.join("spec.json"),
            base,
        }
    }

    /// Where the daemon writes its pid.
    pub fn pid_file(&self) -> PathBuf {
        self.pipe.join("nvidia-cuda-mps-control.pid")
    }

    /// Where the output of `nvidia-cuda-mps-control -d` goes.
    pub fn startup_output(&self) -> PathBuf {
        self.log.join("startup.out")
    }
}

impl Tools {
    /// `nvidia-cuda-mps-control -d` (`-d -M` for a multi-user spec) with the daemon's devices
    /// and directories; with
    /// `isolate_shm`, run as `unshare --mount --propagation private -- sh -c <SHM_SCRIPT> sh
    /// <shm> <mps-control>` so the daemon and its servers see the per-daemon tmpfs as
    /// `/dev/shm`, the same one the clients get bind-mounted.
    ///
    /// # Errors
    /// [`SharingError::NonUtf8Path`] for a directory that is not UTF-8.
    pub(crate) fn daemon_command(
        &self,
        dirs: &DaemonDirs,
        spec: &MpsDaemonSpec,
        isolate_shm: bool,
    ) -> Result<CommandLine, SharingError> {
        let mps = path_str(&self.mps_control)?.to_string();
        let script = if spec.multi_user {
            SHM_SCRIPT_MULTI_USER
        } else {
            SHM_SCRIPT
        };
        let mut cmd = if isolate_shm {
            let args = [
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
                "sh",
                path_str(&dirs.shm)?,
                &mps,
            ];
            CommandLine::new("unshare", args.map(String::from).to_vec())
        } else {
            let mut args = vec!["-d".to_string()];
            if spec.multi_user {
                args.push(MULTI_USER_FLAG.into());
            }
            CommandLine::new(mps, args)
        };
        cmd.env = self.env.clone();
        cmd.env.extend([
            ("CUDA_VISIBLE_DEVICES".into(), spec.visible_devices()),
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                path_str(&dirs.pipe)?.into(),
            ),
            ("CUDA_MPS_LOG_DIRECTORY".into(), path_str(&dirs.log)?.into()),
        ]);
        Ok(cmd)
    }

    /// `echo <command> | nvidia-cuda-mps-control` against the daemon in `dirs`.
    ///
    /// # Errors
    /// [`SharingError::NonUtf8Path`] for a pipe directory that is not UTF-8.
    pub(crate) fn control_command(
        &self,
        dirs: &DaemonDirs,
        command: &str,
    ) -> Result<CommandLine, SharingError> {
        let mut cmd = CommandLine::new(&self.mps_control, Vec::new());
        cmd.env = self.env.clone();
        cmd.env.extend([
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                path_str(&dirs.pipe)?.into(),
            ),
            ("CUDA_MPS_LOG_DIRECTORY".into(), path_str(&dirs.log)?.into()),
        ]);
        cmd.stdin = Some(format!("{command}\n"));
        Ok(cmd)
    }

    /// Sends one control command and returns its trimmed answer.
    ///
    /// # Errors
    /// The tool's failure ([`SharingError::ToolFailed`], …): e.g. no daemon listening.
    pub(crate) fn control(&self, dirs: &DaemonDirs, command: &str) -> Result<String, SharingError> {
        let cmd = self.control_command(dirs, command)?;
        let done = exec::run_checked(&cmd, self.timeout, None)?;
        Ok(done.stdout.trim().to_string())
    }
}

/// A thread-percentage answer such as `100.0` or `50`.
pub(crate) fn parse_percentage(answer: &str) -> Option<f64> {
    answer
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
}

/// A memory-limit answer in MiB: `4096M`, `4096MB`, `4G`, `4GB`, or a bare number of MiB.
pub(crate) fn parse_mib(answer: &str) -> Option<u64> {
    let a = answer.trim();
    let (number, factor) = if let Some(n) = a.strip_suffix("MB").or_else(|| a.strip_suffix('M')) {
        (n, 1.0)
    } else if let Some(n) = a.strip_suffix("GB").or_else(|| a.strip_suffix('G')) {
        (n, 1024.0)
    } else {
        (a, 1.0)
    };
    let value = number.trim().parse::<f64>().ok()? * factor;
    (value >= 0.0 && value.fract() == 0.0).then_some(value as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::MpsDevice;

    fn spec() -> MpsDaemonSpec {
        let dev = |uuid: &str, full_gpu| MpsDevice {
            uuid: uuid.into(),
            full_gpu,
        };
        MpsDaemonSpec {
            id: "c1".into(),
            devices: vec![dev("GPU-bb", true), dev("MIG-aa", false)],
            active_thread_percentage: None,
            pinned_memory_bytes: Vec::new(),
            multi_user: false,
        }
    }

    fn env(cmd: &CommandLine) -> Vec<(&str, &str)> {
        cmd.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn daemon_command_without_isolation_runs_the_tool_with_devices_in_spec_order() {
        let tools = Tools::new(
            "/d/usr/bin/nvidia-smi",
            "/d/usr/bin/nvidia-cuda-mps-control",
        );
        let dirs = DaemonDirs::new(Path::new("/p/mps"), "c1");
        let got = tools.daemon_command(&dirs, &spec(), false).unwrap();
        assert_eq!(
            got.program,
            PathBuf::from("/d/usr/bin/nvidia-cuda-mps-control")
        );
        assert_eq!(got.args, vec!["-d".to_string()]);
        let want_env = vec![
            ("CUDA_VISIBLE_DEVICES", "GPU-bb,MIG-aa"),
            ("CUDA_MPS_PIPE_DIRECTORY", "/p/mps/c1/pipe"),
            ("CUDA_MPS_LOG_DIRECTORY", "/p/mps/c1/log"),
        ];
        assert_eq!(env(&got), want_env);
    }

    #[test]
    fn daemon_command_with_isolated_shm_binds_the_tmpfs_in_a_private_mount_namespace() {
        let tools = Tools::new("/d/nvidia-smi", "/d/nvidia-cuda-mps-control");
        let dirs = DaemonDirs::new(Path::new("/p/mps"), "c1");
        let got = tools.daemon_command(&dirs, &spec(), true).unwrap();
        assert_eq!(got.program, PathBuf::from("unshare"));
        let want = [
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            "mount --bind \"$1\" /dev/shm && exec \"$2\" -d",
            "sh",
            "/p/mps/c1/shm",
            "/d/nvidia-cuda-mps-control",
        ];
        assert_eq!(got.args, want.map(String::from).to_vec());
        assert_eq!(env(&got)[0], ("CUDA_VISIBLE_DEVICES", "GPU-bb,MIG-aa"));
    }

    #[test]
    fn a_multi_user_daemon_is_started_with_dash_d_dash_capital_m() {
        let tools = Tools::new("/d/nvidia-smi", "/d/nvidia-cuda-mps-control");
        let dirs = DaemonDirs::new(Path::new("/p/mps"), "c1");
        let multi = MpsDaemonSpec {
            multi_user: true,
            ..spec()
        };
        let plain = tools.daemon_command(&dirs, &multi, false).unwrap();
        let isolated = tools.daemon_command(&dirs, &multi, true).unwrap();
        assert_eq!(
            (plain.args, isolated.args[6].as_str()),
            (
                vec!["-d".to_string(), "-M".to_string()],
                "mount --bind \"$1\" /dev/shm && exec \"$2\" -d -M"
            )
        );
    }

    #[test]
    fn control_command_pipes_the_command_with_the_pipe_directory() {
        let tools = Tools::new("/d/nvidia-smi", "/d/nvidia-cuda-mps-control");
        let dirs = DaemonDirs::new(Path::new("/p/mps"), "c1");
        let got = tools.control_command(&dirs, "quit").unwrap();
        assert_eq!(got.stdin.as_deref(), Some("quit\n"));
        assert_eq!(env(&got)[0], ("CUDA_MPS_PIPE_DIRECTORY", "/p/mps/c1/pipe"));
    }

    #[test]
    fn answers_parse_in_the_units_the_daemon_prints() {
        let got = (
            parse_percentage("100.0\n"),
            parse_percentage("abc"),
            parse_mib("4096M"),
            parse_mib("4G"),
            parse_mib("512MB"),
            parse_mib("x"),
        );
        assert_eq!(
            got,
            (Some(100.0), None, Some(4096), Some(4096), Some(512), None)
        );
    }
}
