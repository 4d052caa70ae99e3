//! Cloned identities: two machines presenting one certificate. Each Hello
//! records the boot id it came from when that differs from the last one
//! seen for the certificate; a Hello from another boot while the current
//! session is still connected is a takeover (`security.node.duplicate-session`).
//! A reboot moves on to a new boot id and never comes back to an old one;
//! two clones do. More than [`QUARANTINE_AFTER`] returns to a boot id seen
//! before, within [`CLONE_WINDOW_MS`], quarantine the certificate: revoked
//! (`duplicate-identity`), both clones out through the revocation feed
//! (`security.node.quarantined`); workloads stay bound (I5): an operator
//! joins the real machine again. Sans-IO: the sightings and the time are
//! passed in.

/// The window alternations are counted in.
pub const CLONE_WINDOW_MS: i64 = 10 * 60 * 1000;
/// Alternations the window tolerates; one more quarantines.
pub const QUARANTINE_AFTER: u32 = 3;
/// The reason a quarantined certificate is revoked with.
pub const DUPLICATE_IDENTITY: &str = "duplicate-identity";
/// Security events.
pub const DUPLICATE_SESSION: &str = "security.node.duplicate-session";
pub const QUARANTINED: &str = "security.node.quarantined";

/// What a Hello means for a certificate's clone watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneVerdict {
    /// The Hello comes from another boot while the certificate's session is
    /// connected.
    pub takeover: bool,
    /// Returns to a boot id seen before, within the window, this one
    /// included.
    pub alternations: u32,
    /// Record this boot id as a sighting (it differs from the last one).
    pub record: bool,
}

impl CloneVerdict {
    pub fn quarantine(&self) -> bool {
        self.alternations > QUARANTINE_AFTER
    }
}

/// `sightings`: the certificate's boot ids in the order they were first
/// seen in turn (oldest first) with when, `connected_boot`: the boot id of
/// its session if that is connected, `boot`: this Hello's.
pub fn judge(
    sightings: &[(String, i64)],
    connected_boot: Option<&str>,
    boot: &str,
    now_ms: i64,
) -> CloneVerdict {
    let recent: Vec<&str> = sightings
        .iter()
        .filter(|(_, at)| now_ms - at <= CLONE_WINDOW_MS)
        .map(|(b, _)| b.as_str())
        .collect();
    let record = sightings.last().is_none_or(|(last, _)| last != boot);
    let mut seq = recent.clone();
    if record {
        seq.push(boot);
    }
    let mut alternations = 0;
    for (i, b) in seq.iter().enumerate() {
        if seq[..i].contains(b) {
            alternations += 1;
        }
    }
    CloneVerdict {
        takeover: connected_boot.is_some_and(|c| c != boot),
        alternations,
        record,
    }
}

/// The fleet event's detail when a join with no token (a re-attestation
/// of the node's TPM) comes from another boot than the connected session.
pub fn reattest_takeover_detail(boot: &str, connected: &str) -> String {
    format!("boot {boot} re-attested the node's TPM while boot {connected} held its session")
}

/// The fleet event's detail of a node quarantined at a re-attestation.
pub fn reattest_quarantine_detail(revoked: &[String]) -> String {
    format!(
        "more than {QUARANTINE_AFTER} alternations between machines re-attesting one TPM \
         identity in {} minutes; certificates revoked ({DUPLICATE_IDENTITY}): {}; join the real \
         machine again with a token",
        CLONE_WINDOW_MS / 60_000,
        if revoked.is_empty() {
            "none".to_string()
        } else {
            revoked.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(v: &[(&str, i64)]) -> Vec<(String, i64)> {
        v.iter().map(|(b, t)| (b.to_string(), *t)).collect()
    }

    #[test]
    fn reboots_and_restarts_are_never_clones() {
        // The same boot again (a daemon restart): nothing to record.
        let v = judge(&seen(&[("a", 0)]), Some("a"), "a", 10);
        assert_eq!((v.takeover, v.alternations, v.record), (false, 0, false));
        // Reboot after reboot: new boot ids, never back.
        let v = judge(&seen(&[("a", 0), ("b", 10), ("c", 20)]), None, "d", 30);
        assert_eq!((v.takeover, v.alternations), (false, 0));
        assert!(v.record && !v.quarantine());
    }

    #[test]
    fn a_boot_that_takes_a_connected_session_is_a_takeover() {
        let v = judge(&seen(&[("a", 0)]), Some("a"), "b", 10);
        assert!(v.takeover && v.record);
        assert_eq!(v.alternations, 0);
    }

    #[test]
    fn more_than_three_alternations_in_the_window_quarantine() {
        let mut s = seen(&[("a", 0), ("b", 1)]);
        // a, b, a: one alternation; b: two; a: three; b: four.
        for (i, (boot, want)) in [("a", 1), ("b", 2), ("a", 3), ("b", 4)].iter().enumerate() {
            let v = judge(&s, Some("x"), boot, 2 + i as i64);
            assert_eq!(v.alternations, *want, "{boot}");
            assert_eq!(v.quarantine(), *want > 3);
            s.push((boot.to_string(), 2 + i as i64));
        }
    }

    #[test]
    fn alternations_age_out_of_the_window() {
        let s = seen(&[("a", 0), ("b", 1), ("a", 2), ("b", 3)]);
        let late = CLONE_WINDOW_MS + 3;
        // Only ("b", 3) is still in the window: a is new again.
        let v = judge(&s, None, "a", late);
        assert_eq!(v.alternations, 0);
        let v = judge(&s, None, "a", 10);
        assert_eq!(v.alternations, 3);
        assert!(!v.quarantine());
    }
}
