//! The typed errors of a run, so that callers act on what happened rather than parse
//! messages: which devices stopped answering (`--replan-on-failure` degrades exactly those),
//! a wait that timed out, a kernel's status. They travel inside `anyhow::Error` (with its
//! context) and come back out with `downcast_ref::<RunError>()`; their text is the one-line
//! message users see.

/// What ended a run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RunError {
    /// The failure detector found these devices silent for the whole timeout while
    /// `waiter` waited for them in a collective.
    #[error("device {} stopped answering: no sign of life for {ms} ms while device {waiter} waited for it in collective #{collective}", names.join(", "))]
    DeviceFailed { devices: Vec<usize>, names: Vec<String>, ms: u128, waiter: String, collective: usize },
    /// A send or recv waited longer than `--timeout` for its peer.
    #[error("{0}")]
    Timeout(String),
    /// A kernel returned a non-zero status.
    #[error("node '{node}': {}", match status { 1 => "gather index out of range".to_string(), 2 => "integer division by zero".to_string(), s => format!("kernel failed with status {s}") })]
    KernelStatus { node: String, status: u32 },
    /// A step of `device` (named `label`) failed with `cause`.
    #[error("{label}: {cause}")]
    OnDevice { device: usize, label: String, cause: Box<RunError> },
    /// Anything else, as its message.
    #[error("{0}")]
    Other(String),
}

impl RunError {
    /// The devices found failed, wherever in the error they are named.
    pub fn failed_devices(&self) -> Vec<usize> {
        match self {
            RunError::DeviceFailed { devices, .. } => devices.clone(),
            RunError::OnDevice { cause, .. } => cause.failed_devices(),
            _ => Vec::new(),
        }
    }

    /// `e` as a run error: itself when it is one (under any context), else its message.
    pub fn of(e: &anyhow::Error) -> RunError {
        match e.downcast_ref::<RunError>() {
            Some(r) if e.chain().count() == 1 => r.clone(),
            _ => RunError::Other(format!("{e:#}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_devices_are_found_under_context_and_wrapping() {
        let failed = RunError::DeviceFailed {
            devices: vec![5],
            names: vec!["(1,1)".into()],
            ms: 200,
            waiter: "(0,1)".into(),
            collective: 3,
        };
        assert_eq!(
            failed.to_string(),
            "device (1,1) stopped answering: no sign of life for 200 ms while device (0,1) waited for it in collective #3"
        );
        let wrapped = RunError::OnDevice { device: 1, label: "device 1 (0,1)".into(), cause: Box::new(failed) };
        let e = anyhow::Error::from(wrapped).context("--degrade");
        assert_eq!(e.downcast_ref::<RunError>().unwrap().failed_devices(), [5]);
        assert_eq!(
            RunError::KernelStatus { node: "g".into(), status: 1 }.to_string(),
            "node 'g': gather index out of range"
        );
    }
}
