//! Cloned identities: two machines presenting one certificate. A Hello
//! with the node's signed proof (`bcd_proto::hello`) records the boot id
//! it came from, with the proof, when that differs from the last one seen
//! for the certificate; a Hello from another boot while the current
//! session is still connected is a takeover (`security.node.duplicate-session`).
//!
//! Only the key holder quarantines, and only from proofs it verified
//! itself ([`alternations`]): a gateway writes the sightings, and may hold
//! back, reorder, replay or misdate them, so their order of arrival and
//! their times say nothing. The count each proof carries does: one
//! machine signs each count once, and its proofs in count order visit
//! each boot in one run and never come back to one, whatever subset a
//! gateway shows in whatever order. Two machines with one key come back
//! and forth (or sign one count twice). More than [`QUARANTINE_AFTER`]
//! such returns among the proofs recorded within [`CLONE_WINDOW_MS`]
//! quarantine the node: its certificates revoked (`duplicate-identity`,
//! with a signed statement), both clones out through the revocation feed
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

/// What a gateway's Hello does for the clone watch (the quarantine is the
/// key holder's, [`alternations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtHello {
    /// The Hello comes from another boot while the certificate's session
    /// is connected (`security.node.duplicate-session`).
    pub takeover: bool,
    /// Record this boot, with the Hello's proof, as a sighting.
    pub record: bool,
}

/// `last`: the boot of the certificate's newest sighting, `connected`: the
/// boot of its session if that is connected, `boot`: this Hello's, proved
/// or not (an unproved Hello records nothing: the key holder could not
/// believe it). `first_confirmed`: its proof says the node runs a confirmed
/// release and the node's unproved Hellos are not refused yet; it is
/// recorded whatever its boot, so the key holder verifies it and refuses
/// them from then on ([`Backend::require_hello_proofs`](crate::Backend::require_hello_proofs)).
pub fn at_hello(
    last: Option<&str>,
    connected: Option<&str>,
    boot: &str,
    proved: bool,
    first_confirmed: bool,
) -> AtHello {
    AtHello {
        takeover: connected.is_some_and(|c| c != boot),
        record: proved && (last != Some(boot) || first_confirmed),
    }
}

/// Whether a Hello goes on: one without a proof (or with one the gateway
/// could not verify) is refused once the key holder saw the node prove its
/// Hellos from a confirmed release (`proofs_required`): a copy of the key
/// on another machine that signs nothing is not let in unseen.
pub fn admits(proved: bool, proofs_required: bool) -> bool {
    proved || !proofs_required
}

/// The fleet event's detail of a takeover at a Hello.
pub fn takeover_detail(serial: &str, boot: &str, connected: &str) -> String {
    format!("certificate {serial}: boot {boot} took the session from boot {connected}")
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

/// A security event: a sighting whose proof the key holder could not
/// verify (a gateway wrote it, or rewrote it).
pub const FORGED_SIGHTING: &str = "security.hello.forged";

/// Returns to a boot seen before, in count order, among `proofs`: the
/// (count, boot id) of the verified proofs recorded for one certificate,
/// in any order. A count signed for two boots is a return too.
pub fn alternations(proofs: &[(u64, &str)]) -> u32 {
    let mut sorted = proofs.to_vec();
    sorted.sort();
    sorted.dedup();
    let mut runs: Vec<&str> = Vec::new();
    let mut alternations = 0;
    let mut last_seq = None;
    for (seq, boot) in sorted {
        if last_seq == Some(seq) {
            // Two boots signed one count: two machines hold the key.
            alternations += 1;
        }
        last_seq = Some(seq);
        if runs.last() == Some(&boot) {
            continue;
        }
        if runs.contains(&boot) {
            alternations += 1;
        }
        runs.push(boot);
    }
    alternations
}

/// The fleet event's detail of a sighting whose proof did not verify.
pub fn forged_detail(s: &crate::sessions::Sighting, why: &str) -> String {
    format!(
        "a sighting of certificate {} (boot {}, count {}) that the node did not prove: {why}; \
         a gateway wrote it; dropped, it counts for nothing",
        s.serial, s.boot_id, s.seq
    )
}

/// The fleet event's detail of a node the key holder quarantined from
/// its proofs.
pub fn quarantine_detail(serial: &str, alternations: u32, revoked: &[String]) -> String {
    format!(
        "certificate {serial}: {alternations} alternations between machines in {} minutes, in \
         the node's own signed Hellos; certificates revoked ({DUPLICATE_IDENTITY}): {}; join the \
         real machine again",
        CLONE_WINDOW_MS / 60_000,
        if revoked.is_empty() {
            "none".to_string()
        } else {
            revoked.join(", ")
        }
    )
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
    fn a_proved_hello_is_recorded_on_a_new_boot_or_when_it_first_shows_a_confirmed_release() {
        let rec = |last, proved, first| at_hello(last, None, "a", proved, first).record;
        assert!(rec(None, true, false) && rec(Some("b"), true, false));
        assert!(!rec(Some("a"), true, false), "the same boot again");
        assert!(
            rec(Some("a"), true, true),
            "the key holder learns proofs are required"
        );
        assert!(
            !rec(None, false, false) && !rec(None, false, true),
            "nothing to verify"
        );
    }

    #[test]
    fn an_unproved_hello_is_refused_once_proofs_are_required_only() {
        assert!(admits(false, false) && admits(true, false) && admits(true, true));
        assert!(!admits(false, true));
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
    fn one_machine_s_proofs_in_any_order_never_alternate() {
        // Boots a (counts 1-3), b (4-6), c (7): a reboot after another.
        let real = [
            (1, "a"),
            (2, "a"),
            (3, "a"),
            (4, "b"),
            (5, "b"),
            (6, "b"),
            (7, "c"),
        ];
        assert_eq!(alternations(&real), 0);
        // A gateway shows any subset, in any order, repeated: still none.
        let shown = [
            (6, "b"),
            (1, "a"),
            (7, "c"),
            (3, "a"),
            (4, "b"),
            (1, "a"),
            (6, "b"),
        ];
        assert_eq!(alternations(&shown), 0);
        for k in 0..real.len() {
            let mut v = real.to_vec();
            v.rotate_left(k);
            v.truncate(real.len() - k / 2);
            assert_eq!(alternations(&v), 0, "{v:?}");
        }
    }

    #[test]
    fn two_machines_on_one_key_alternate_in_count_order() {
        // The copy starts at the original's count: both sign 11.
        assert_eq!(alternations(&[(10, "a"), (11, "a"), (11, "b")]), 1);
        // Raised by the Welcome, they take turns.
        let turns = [(12, "a"), (13, "b"), (14, "a"), (15, "b"), (16, "a")];
        assert_eq!(alternations(&turns), 3);
        assert_eq!(alternations(&[turns.as_slice(), &[(17, "b")]].concat()), 4);
        assert!(alternations(&[turns.as_slice(), &[(17, "b")]].concat()) > QUARANTINE_AFTER);
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
