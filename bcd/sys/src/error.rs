//! Printing an error with its causes.
//!
//! Library errors keep their cause as `#[source]` and do not repeat it in
//! their own message; whoever shows the error to a person prints the chain
//! once, with this.

/// Every message of an error's source chain, joined with `": "`. A cause
/// whose text an earlier message already contains is skipped: transport
/// errors often embed their source's text, and bury the useful part
/// (refused, pin mismatch) several sources deep.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let m = s.to_string();
        if !m.is_empty() && !parts.iter().any(|p| p.contains(&m)) {
            parts.push(m);
        }
        cur = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot write /var/lib/bcd/identity.json")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("rename failed: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn joins_the_chain_and_skips_repeated_causes() {
        let io = std::io::Error::other("no space left on device");
        let e = Outer(Middle(io));
        // The middle error already carries the io error's text.
        assert_eq!(
            chain(&e),
            "cannot write /var/lib/bcd/identity.json: rename failed: no space left on device"
        );
        let plain = std::io::Error::other("refused");
        assert_eq!(chain(&plain), "refused");
    }
}
