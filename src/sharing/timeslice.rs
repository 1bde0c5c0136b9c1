//! Compute mode and time-slice of full GPUs with `nvidia-smi`.

use super::commands::CommandLine;
use super::exec;
use super::spec::validate_uuid;
use super::{SharingError, Tools};

/// The compute modes this driver sets: `DEFAULT` (processes time-share the GPU) and
/// `EXCLUSIVE_PROCESS` (one process: the MPS server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    Default,
    ExclusiveProcess,
}

impl ComputeMode {
    /// The `nvidia-smi -c` argument.
    pub fn as_arg(self) -> &'static str {
        match self {
            ComputeMode::Default => "DEFAULT",
            ComputeMode::ExclusiveProcess => "EXCLUSIVE_PROCESS",
        }
    }
}

/// What a time-slice reset achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetOutcome {
    /// Compute mode DEFAULT and time-slice 0 are set.
    Reset,
    /// The GPU said "Not Supported" for a step; nothing to undo, the caller may log it.
    NotSupported { command: String, output: String },
}

fn full_gpu(step: &'static str, uuid: &str) -> Result<(), SharingError> {
    validate_uuid("uuid", uuid)?;
    if uuid.starts_with("GPU-") {
        Ok(())
    } else {
        Err(SharingError::NotAFullGpu {
            step,
            uuid: uuid.to_string(),
        })
    }
}

impl Tools {
    /// `nvidia-smi -i <UUID> -c <MODE>` for a validated full-GPU UUID.
    ///
    /// # Errors
    /// [`SharingError::InvalidUuid`], [`SharingError::NotAFullGpu`] for a MIG UUID, or the
    /// tool's failure with its command line, status and output.
    pub fn compute_mode_command(
        &self,
        gpu_uuid: &str,
        mode: ComputeMode,
    ) -> Result<CommandLine, SharingError> {
        full_gpu("setting compute mode", gpu_uuid)?;
        let args = vec![
            "-i".into(),
            gpu_uuid.into(),
            "-c".into(),
            mode.as_arg().into(),
        ];
        Ok(self.smi(args))
    }

    /// `nvidia-smi compute-policy -i <UUID> --set-timeslice <N>` for a full GPU, N in 0..=3.
    ///
    /// # Errors
    /// As [`Tools::compute_mode_command`], plus [`SharingError::InvalidTimeslice`].
    pub fn timeslice_command(
        &self,
        gpu_uuid: &str,
        level: u8,
    ) -> Result<CommandLine, SharingError> {
        full_gpu("setting time-slice", gpu_uuid)?;
        if level > 3 {
            return Err(SharingError::InvalidTimeslice { value: level });
        }
        let args = vec![
            "compute-policy".into(),
            "-i".into(),
            gpu_uuid.into(),
            "--set-timeslice".into(),
            level.to_string(),
        ];
        Ok(self.smi(args))
    }

    fn smi(&self, args: Vec<String>) -> CommandLine {
        let mut cmd = CommandLine::new(&self.nvidia_smi, args);
        cmd.env = self.env.clone();
        cmd
    }

    /// Sets the compute mode of one full GPU.
    ///
    /// # Errors
    /// Bad UUID, MIG UUID, or the tool failed ([`SharingError::ToolFailed`] with command line,
    /// status and output).
    pub fn set_compute_mode(&self, gpu_uuid: &str, mode: ComputeMode) -> Result<(), SharingError> {
        let cmd = self.compute_mode_command(gpu_uuid, mode)?;
        exec::run_checked(&cmd, self.timeout, None).map(|_| ())
    }

    /// Time-slicing on one full GPU: compute mode DEFAULT, then the time-slice level
    /// (0 Default, 1 Short, 2 Medium, 3 Long). The setting is GPU-wide and not persistent.
    ///
    /// # Errors
    /// As [`Tools::set_compute_mode`], plus [`SharingError::InvalidTimeslice`]; nothing is run
    /// when an argument is invalid.
    pub fn set_timeslice(&self, gpu_uuid: &str, level: u8) -> Result<(), SharingError> {
        let slice = self.timeslice_command(gpu_uuid, level)?;
        self.set_compute_mode(gpu_uuid, ComputeMode::Default)?;
        exec::run_checked(&slice, self.timeout, None).map(|_| ())
    }

    /// Puts a full GPU back to compute mode DEFAULT and time-slice 0. A step the GPU answers
    /// with "Not Supported" is not an error: the outcome says so and the other step still
    /// runs.
    ///
    /// # Errors
    /// As [`Tools::set_timeslice`] for any other failure.
    pub fn reset_timeslice(&self, gpu_uuid: &str) -> Result<ResetOutcome, SharingError> {
        let steps = [
            self.compute_mode_command(gpu_uuid, ComputeMode::Default)?,
            self.timeslice_command(gpu_uuid, 0)?,
        ];
        let mut outcome = ResetOutcome::Reset;
        for cmd in &steps {
            let done = exec::run(cmd, self.timeout, None)?;
            if done.success {
                continue;
            }
            let output = done.tail();
            if !output.to_ascii_lowercase().contains("not supported") {
                return Err(exec::failed(cmd, &done));
            }
            if outcome == ResetOutcome::Reset {
                outcome = ResetOutcome::NotSupported {
                    command: cmd.to_string(),
                    output,
                };
            }
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(cmd: &CommandLine) -> Vec<&str> {
        cmd.args.iter().map(String::as_str).collect()
    }

    #[test]
    fn timeslice_command_is_compute_policy_with_the_level() {
        let tools = Tools::new("/x/nvidia-smi", "/x/mps");
        let got = tools.timeslice_command("GPU-12ab-34", 3).unwrap();
        assert_eq!(
            argv(&got),
            [
                "compute-policy",
                "-i",
                "GPU-12ab-34",
                "--set-timeslice",
                "3"
            ]
        );
    }

    #[test]
    fn timeslice_level_four_is_rejected_naming_the_choices() {
        let tools = Tools::new("/x/nvidia-smi", "/x/mps");
        let err = tools.timeslice_command("GPU-12ab", 4).unwrap_err();
        assert!(
            err.to_string()
                .contains("0 Default, 1 Short, 2 Medium or 3 Long")
        );
    }

    #[test]
    fn compute_mode_on_a_mig_device_is_rejected() {
        let tools = Tools::new("/x/nvidia-smi", "/x/mps");
        let err = tools
            .compute_mode_command("MIG-12ab", ComputeMode::Default)
            .unwrap_err();
        assert!(matches!(err, SharingError::NotAFullGpu { .. }), "{err:?}");
    }

    #[test]
    fn a_uuid_with_shell_characters_never_reaches_a_command() {
        let tools = Tools::new("/x/nvidia-smi", "/x/mps");
        let err = tools
            .compute_mode_command("GPU-1; rm -rf /", ComputeMode::Default)
            .unwrap_err();
        assert!(matches!(err, SharingError::InvalidUuid { .. }), "{err:?}");
    }
}
