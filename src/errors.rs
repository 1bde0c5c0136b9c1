//! Error rendering shared by every layer: one line for messages that leave the process (gRPC
//! statuses the kubelet shows in events, per-claim errors, log fields).

/// Renders an error and its causes on one line, `error: cause: cause`.
///
/// Never fails; an error without sources renders as its own message.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        message.push_str(": ");
        message.push_str(&inner.to_string());
        cause = inner.source();
    }
    message
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer step failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_error_on_one_line() {
        let error = Outer(std::io::Error::other("disk full"));
        assert_eq!(super::error_chain(&error), "outer step failed: disk full");
    }
}
