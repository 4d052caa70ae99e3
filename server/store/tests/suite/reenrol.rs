//! Re-enrolment: a machine proves the key of its node's current
//! certificate and joins again as the same node.

use std::time::Duration;

use bc_store::machines::Enrolled;
use bc_store::nodes::{REENROLLED, SealStatement, StatementKind};
use bc_store::tokens::{Joined, PreviousProof};
use bc_store::{Refusal, Store, TxError};

use super::{Fixture, fake_cert, join_input, joined, sign, token, verify};

/// A proof for `node` signed with the key of `fake_cert(key_of)`.
fn proof(node: &str, key_of: u8, message: &[u8]) -> PreviousProof {
    PreviousProof {
        node_id: node.into(),
        message: message.to_vec(),
        signature: sign(&fake_cert(key_of).der, message),
        verify: std::sync::Arc::new(verify),
    }
}

fn no_seal() -> SealStatement {
    Box::new(|_| b"sealed".to_vec())
}

async fn reenrol(
    s: &Store,
    token_id: &str,
    p: &PreviousProof,
    cert: u8,
) -> Result<Joined, TxError> {
    s.reenrol(
        &join_input(token_id, "h"),
        p,
        Box::new(move |_, _| Ok(fake_cert(cert))),
        no_seal(),
    )
    .await
}

fn refusal(r: Result<Joined, TxError>) -> Refusal {
    match r {
        Err(TxError::Refused(r)) => r,
        other => panic!("expected a refusal, got {:?}", other.map(|j| j.node_id)),
    }
}

fn not_reenrolled(r: Result<Joined, TxError>, node: &str, why: &str) {
    assert_eq!(
        refusal(r),
        Refusal::NotReenrolled(node.into(), why.into()),
        "refused with the reason"
    );
}

pub async fn re_enrolment_keeps_the_node_and_revokes_its_earlier_certificates(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    // A renewal leaves two valid certificates; both are revoked.
    s.renew("fp1", Box::new(|_, _, _| Ok(fake_cert(2))))
        .await
        .unwrap();
    s.create_token(&token("re", Duration::from_secs(600), 2))
        .await
        .unwrap();
    f.advance(Duration::from_secs(5));
    let (expect_node, at) = (node.clone(), super::T0 + 5_000);
    let j = s
        .reenrol(
            &join_input("re", "h"),
            &proof(&node, 2, b"statement"),
            Box::new(move |id, now| {
                assert_eq!((id, now), (expect_node.as_str(), at), "the same node, now");
                Ok(fake_cert(3))
            }),
            Box::new(|st| {
                assert_eq!(st.kind, StatementKind::Revoked);
                assert_eq!(st.serials, vec!["serial1", "serial2"]);
                assert_eq!(st.reason, REENROLLED);
                b"sealed".to_vec()
            }),
        )
        .await
        .unwrap();
    assert_eq!(j.node_id, node, "the same node id");
    assert_eq!(j.identity_generation, 2);
    assert_eq!(j.cert.serial, "serial3");
    assert_eq!(s.check_cert("fp3").await.unwrap().node_id, node);
    for old in ["fp1", "fp2"] {
        assert_eq!(
            s.check_cert(old).await.unwrap_err().refusal(),
            Some(&Refusal::Revoked(
                REENROLLED.into(),
                Some(b"sealed".to_vec())
            )),
            "{old} is revoked with the statement"
        );
    }
    let revoked = s.revoked_since(0).await.unwrap();
    assert_eq!(
        revoked
            .iter()
            .map(|r| (r.serial.as_str(), r.reason.as_str(), r.node_id.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("serial1", REENROLLED, node.as_str()),
            ("serial2", REENROLLED, node.as_str())
        ],
        "the gateways' revocation feed carries both"
    );
    assert!(
        revoked
            .iter()
            .all(|r| r.statement.as_deref() == Some(b"sealed"))
    );
    let nodes = s.list_nodes().await.unwrap().nodes;
    assert_eq!(nodes.len(), 1, "one node");
    assert_eq!(nodes[0].node_id, node);
    let events = s.fleet_events(&node, 10).await.unwrap();
    assert!(
        events[0].starts_with("node.re-enrolled: ")
            && events[0].contains("generation 2")
            && events[0].contains("serial1, serial2"),
        "{events:?}"
    );
    // The old certificates prove nothing any more; the new one does, and
    // the token had one use left.
    not_reenrolled(
        reenrol(s, "re", &proof(&node, 2, b"again"), 4).await,
        &node,
        "the proof is not signed by the key of its current certificate",
    );
    not_reenrolled(
        reenrol(s, "re", &proof(&node, 9, b"again"), 4).await,
        &node,
        "the proof is not signed by the key of its current certificate",
    );
    let j = reenrol(s, "re", &proof(&node, 3, b"again"), 4)
        .await
        .unwrap();
    assert_eq!(
        (j.node_id.as_str(), j.identity_generation),
        (node.as_str(), 3)
    );
    assert_eq!(
        refusal(reenrol(s, "re", &proof(&node, 4, b"more"), 5).await),
        Refusal::UsedToken,
        "each re-enrolment spent one use"
    );
}

pub async fn refused_proofs_change_nothing_and_spend_nothing(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    s.create_token(&token("re", Duration::from_secs(600), 1))
        .await
        .unwrap();
    not_reenrolled(
        reenrol(s, "re", &proof(&node, 9, b"m"), 8).await,
        &node,
        "the proof is not signed by the key of its current certificate",
    );
    // A proof signed over another message (another key or token).
    let mut other = proof(&node, 1, b"m");
    other.message = b"n".to_vec();
    not_reenrolled(
        reenrol(s, "re", &other, 8).await,
        &node,
        "the proof is not signed by the key of its current certificate",
    );
    not_reenrolled(
        reenrol(s, "re", &proof("nd-000000000000", 1, b"m"), 8).await,
        "nd-000000000000",
        "there is no such node",
    );
    // A bad token is refused as a token, whatever the proof.
    assert_eq!(
        refusal(
            s.reenrol(
                &join_input("re", "wrong"),
                &proof(&node, 1, b"m"),
                Box::new(|_, _| Ok(fake_cert(8))),
                no_seal(),
            )
            .await
        ),
        Refusal::UnknownToken
    );
    assert_eq!(s.check_cert("fp1").await.unwrap().node_id, node);
    assert_eq!(
        s.check_cert("fp8").await.unwrap_err().refusal(),
        Some(&Refusal::UnknownCertificate),
        "no certificate recorded"
    );
    assert!(s.revoked_since(0).await.unwrap().is_empty());
    assert!(s.fleet_events(&node, 10).await.unwrap().is_empty());
    // A deleted node is not re-enrolled, even with its key.
    assert!(s.delete_node(&node, no_seal()).await.unwrap());
    let before = s.revoked_since(0).await.unwrap();
    not_reenrolled(
        reenrol(s, "re", &proof(&node, 1, b"m"), 8).await,
        &node,
        "it was deleted",
    );
    assert_eq!(s.revoked_since(0).await.unwrap(), before);
    // Every refusal left the token's one use: a join as a new node spends it.
    let fresh = s
        .join(&join_input("re", "h"), Box::new(|_, _| Ok(fake_cert(8))))
        .await
        .unwrap();
    assert_ne!(fresh.node_id, node);
    assert_eq!(fresh.identity_generation, 1);
    let nodes = s.list_nodes().await.unwrap().nodes;
    assert_eq!(
        nodes.iter().map(|n| n.node_id.as_str()).collect::<Vec<_>>(),
        vec![fresh.node_id.as_str()]
    );
}

pub async fn racing_re_enrolments_of_one_node_make_one_identity(f: Fixture) {
    const ROUNDS: u8 = 20;
    let (a, b) = (f.store.clone(), f.reopen().await);
    let node = joined(&a, 1).await;
    // One use more than the winners need: a loser is refused for its
    // proof, never for the token.
    a.create_token(&token(
        "re",
        Duration::from_secs(600),
        u32::from(ROUNDS) + 1,
    ))
    .await
    .unwrap();
    let mut current = 1;
    for round in 0..ROUNDS {
        let (ca, cb) = (10 + 2 * round, 11 + 2 * round);
        let (pa, pb) = (
            proof(&node, current, &[b'a', round]),
            proof(&node, current, &[b'b', round]),
        );
        let (ra, rb) = tokio::join!(reenrol(&a, "re", &pa, ca), reenrol(&b, "re", &pb, cb));
        let winner = match (ra, rb) {
            (Ok(j), Err(e)) | (Err(e), Ok(j)) => {
                assert_eq!(
                    e.refusal(),
                    Some(&Refusal::NotReenrolled(
                        node.to_string(),
                        "the proof is not signed by the key of its current certificate".into()
                    )),
                    "round {round}: the loser's proof is stale"
                );
                j
            }
            (ra, rb) => panic!(
                "round {round}: exactly one re-enrolment wins: {:?} {:?}",
                ra.map(|j| j.cert.serial),
                rb.map(|j| j.cert.serial)
            ),
        };
        assert_eq!(winner.node_id, node);
        assert_eq!(winner.identity_generation, u64::from(round) + 2);
        current = if winner.cert.serial == format!("serial{ca}") {
            ca
        } else {
            cb
        };
        let loser = ca + cb - current;
        assert_eq!(
            a.check_cert(&format!("fp{loser}"))
                .await
                .unwrap_err()
                .refusal(),
            Some(&Refusal::UnknownCertificate),
            "round {round}: the loser recorded nothing"
        );
    }
    assert_eq!(a.list_nodes().await.unwrap().nodes.len(), 1, "one node");
    assert_eq!(
        a.check_cert(&format!("fp{current}")).await.unwrap().node_id,
        node,
        "the last winner's certificate is the one valid"
    );
    assert_eq!(
        a.revoked_since(0).await.unwrap().len(),
        usize::from(ROUNDS),
        "each winner revoked the one before"
    );
    // Only the winners spent the token: one use is left.
    let last = reenrol(&a, "re", &proof(&node, current, b"z"), 98)
        .await
        .unwrap();
    assert_eq!(last.identity_generation, u64::from(ROUNDS) + 2);
    assert_eq!(
        refusal(reenrol(&a, "re", &proof(&node, 98, b"z"), 99).await),
        Refusal::UsedToken
    );
}

async fn attested(s: &Store, token_id: &str, ek: &str, cert: u8) -> Result<Joined, TxError> {
    s.join_attested(
        &join_input(token_id, "h"),
        ek,
        Box::new(move |_, _| Ok(fake_cert(cert))),
        no_seal(),
    )
    .await
}

pub async fn attested_joins_bind_the_ek_and_reclaim_its_node(f: Fixture) {
    let s = &f.store;
    s.create_token(&token("tpm", Duration::from_secs(600), 5))
        .await
        .unwrap();
    let first = attested(s, "tpm", "ek-a", 1).await.unwrap();
    assert_eq!(first.identity_generation, 1);
    // Another EK is another node.
    let other = attested(s, "tpm", "ek-b", 2).await.unwrap();
    assert_ne!(other.node_id, first.node_id, "another TPM, another node");
    // The same EK again: the same node, next generation, old cert revoked.
    let again = attested(s, "tpm", "ek-a", 3).await.unwrap();
    assert_eq!(again.node_id, first.node_id, "the EK reclaims its node");
    assert_eq!(again.identity_generation, 2);
    assert_eq!(
        s.check_cert("fp1").await.unwrap_err().refusal(),
        Some(&Refusal::Revoked(
            REENROLLED.into(),
            Some(b"sealed".to_vec())
        ))
    );
    assert_eq!(s.check_cert("fp3").await.unwrap().node_id, first.node_id);
    let events = s.fleet_events(&first.node_id, 10).await.unwrap();
    assert!(
        format!("{events:?}").contains("reclaimed by its TPM's EK with token tpm"),
        "{events:?}"
    );
    // A refused token binds and spends nothing.
    assert_eq!(
        refusal(attested(s, "no-such-token", "ek-c", 4).await),
        Refusal::UnknownToken
    );
    assert_eq!(s.list_nodes().await.unwrap().nodes.len(), 2);
    // Deleting the node frees its EK: the next join is a new node.
    s.delete_node(&first.node_id, no_seal()).await.unwrap();
    let fresh = attested(s, "tpm", "ek-a", 5).await.unwrap();
    assert_ne!(fresh.node_id, first.node_id);
    assert_eq!(fresh.identity_generation, 1);
}

/// Two first joins of one machine's EK at once, with two tokens through two
/// processes: one node, bound once; the later join reclaims it.
pub async fn racing_first_attested_joins_of_one_ek_make_one_node(f: Fixture) {
    const ROUNDS: u8 = 10;
    let (a, b) = (f.store.clone(), f.reopen().await);
    // Two tokens: one token's row lock would order the two joins already.
    for id in ["tpm-a", "tpm-b"] {
        a.create_token(&token(id, Duration::from_secs(600), u32::from(ROUNDS)))
            .await
            .unwrap();
    }
    for round in 0..ROUNDS {
        let ek = format!("ek-race-{round}");
        let (ra, rb) = tokio::join!(
            attested(&a, "tpm-a", &ek, 10 + 2 * round),
            attested(&b, "tpm-b", &ek, 11 + 2 * round)
        );
        let (ja, jb) = (
            ra.unwrap_or_else(|e| panic!("round {round}: {e}")),
            rb.unwrap_or_else(|e| panic!("round {round}: {e}")),
        );
        assert_eq!(ja.node_id, jb.node_id, "round {round}: one node");
        let mut generations = [ja.identity_generation, jb.identity_generation];
        generations.sort_unstable();
        assert_eq!(generations, [1, 2], "round {round}: bound, then reclaimed");
    }
    assert_eq!(
        a.list_nodes().await.unwrap().nodes.len(),
        usize::from(ROUNDS)
    );
}

fn ek_hash(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

async fn reattest(
    s: &Store,
    ek: &str,
    ca: Option<&str>,
    boot: &str,
    cert: u8,
) -> Result<Enrolled, TxError> {
    s.join_enrolled(
        &join_input("", "h"),
        ek,
        ca,
        boot,
        Box::new(move |_, _| Ok(fake_cert(cert))),
        no_seal(),
        Box::new(|_, _| true),
    )
    .await
}

/// A join with no token from a boot of its own (never seen twice).
async fn tokenless(s: &Store, ek: &str, ca: Option<&str>, cert: u8) -> Result<Joined, TxError> {
    match reattest(s, ek, ca, &format!("boot-{cert}"), cert).await? {
        Enrolled::Joined(j) => Ok(j),
        Enrolled::Quarantined { node_id } => panic!("node {node_id} quarantined"),
        Enrolled::Forged { node_id } => panic!("node {node_id}: binding forged"),
    }
}

/// A join with no token by EK `ek`, whose certificates `proves` judges.
async fn enrolled_by(
    s: &Store,
    ek: &str,
    proves: bc_store::machines::ProvesMachine,
    cert: u8,
) -> Result<Enrolled, TxError> {
    s.join_enrolled(
        &join_input("", "h"),
        ek,
        None,
        "boot-x",
        Box::new(move |_, _| Ok(fake_cert(cert))),
        no_seal(),
        proves,
    )
    .await
}

/// Whoever can write the store rebinds a node to the EK of a TPM of its
/// own. The reclaim asks for a certificate of the node naming the attested
/// machine (the join service checks what the fleet CA signed): none does,
/// so the join is recorded and reclaims nothing.
pub async fn a_rewritten_ek_binding_reclaims_nothing(f: Fixture) {
    use bc_store::machines::{EK_BINDING_FORGED, NewEnrolment};
    let s = &f.store;
    let (ours, theirs) = (ek_hash(0xa1), ek_hash(0xa2));
    s.enrol_machine(&NewEnrolment::ek(&ours, "", "").unwrap())
        .await
        .unwrap();
    let node = tokenless(s, &ours, None, 1).await.unwrap().node_id;
    // The machine's own certificate is fake_cert(1): only it proves the
    // machine.
    let proves = || -> bc_store::machines::ProvesMachine {
        Box::new(|_, der| der == fake_cert(1).der.as_slice())
    };
    f.tamper(&format!(
        "UPDATE nodes SET ek_sha256 = '{theirs}' WHERE id = '{node}'"
    ))
    .await;
    match enrolled_by(s, &theirs, Box::new(|_, _| false), 9)
        .await
        .unwrap()
    {
        Enrolled::Forged { node_id } => assert_eq!(node_id, node),
        Enrolled::Joined(j) => panic!("the rebinding reclaimed {}", j.node_id),
        Enrolled::Quarantined { node_id } => panic!("quarantined {node_id}"),
    }
    let events = s.fleet_events(&node, 10).await.unwrap();
    assert!(
        events.iter().any(|e| e.starts_with(EK_BINDING_FORGED)),
        "{events:?}"
    );
    // The node is as it was: its own machine, bound back, reclaims it.
    f.tamper(&format!(
        "UPDATE nodes SET ek_sha256 = '{ours}' WHERE id = '{node}'"
    ))
    .await;
    match enrolled_by(s, &ours, proves(), 2).await.unwrap() {
        Enrolled::Joined(j) => {
            assert_eq!(
                (j.node_id.as_str(), j.identity_generation),
                (node.as_str(), 2)
            )
        }
        _ => panic!("the node's own machine did not reclaim it"),
    }
}

/// Machines enrolled by their EK (or an EK CA) join with no token, and a
/// machine bound to a node gets that node back at every join, spending
/// nothing.
pub async fn enrolled_machines_join_with_no_token(f: Fixture) {
    use bc_store::machines::{EnrolmentKind, NewEnrolment, ca_id};
    let s = &f.store;
    let (e1, e2, e3) = (ek_hash(0xe1), ek_hash(0xe2), ek_hash(0xe3));
    // Not enrolled: refused, with the hash to enrol; nothing recorded.
    assert_eq!(
        refusal(tokenless(s, &e1, None, 1).await),
        Refusal::NotEnrolled(e1.clone())
    );
    assert!(s.list_nodes().await.unwrap().nodes.is_empty());

    let enrolled = s
        .enrol_machine(&NewEnrolment::ek(&e1, "", "rack 3").unwrap())
        .await
        .unwrap();
    assert_eq!(enrolled.id, format!("ek:{e1}"));
    assert_eq!(enrolled.kind, EnrolmentKind::Ek);
    assert_eq!(enrolled.node_id, None);
    assert_eq!(enrolled.description, "rack 3");
    assert!(matches!(
        s.enrol_machine(&NewEnrolment::ek(&e1, "", "").unwrap()).await,
        Err(TxError::Refused(Refusal::Conflict(m))) if m.contains("already enrolled")
    ));

    // First boot: a new node bound to the EK.
    let first = tokenless(s, &e1, None, 1).await.unwrap();
    assert_eq!(first.identity_generation, 1);
    let listed = s.list_enrolments().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].node_id.as_deref(), Some(first.node_id.as_str()));
    // Every later boot: the same node, next generation, the old one revoked.
    let again = tokenless(s, &e1, None, 2).await.unwrap();
    assert_eq!(again.node_id, first.node_id);
    assert_eq!(again.identity_generation, 2);
    assert_eq!(
        s.check_cert("fp1").await.unwrap_err().refusal(),
        Some(&Refusal::Revoked(
            REENROLLED.into(),
            Some(b"sealed".to_vec())
        ))
    );
    let events = s.fleet_events(&first.node_id, 10).await.unwrap();
    assert!(
        format!("{events:?}").contains("re-attested by its TPM's EK with no token"),
        "{events:?}"
    );

    // An EK CA admits the EKs it certified once it is enrolled.
    let ca_der = vec![0x30, 0x03, 0x02, 0x01, 0x07];
    let ca = ca_id(&ca_der);
    assert_eq!(
        refusal(tokenless(s, &e2, Some(&ca), 3).await),
        Refusal::NotEnrolled(e2.clone())
    );
    let added = s
        .enrol_machine(&NewEnrolment::ek_ca(
            ca_der.clone(),
            vec![0x30, 0x00, 0x30, 0x00],
            "CN=EK CA",
            "",
        ))
        .await
        .unwrap();
    assert_eq!(
        (added.id.as_str(), added.kind),
        (ca.as_str(), EnrolmentKind::EkCa)
    );
    assert_eq!(added.ca_der.as_deref(), Some(ca_der.as_slice()));
    assert_eq!(
        added.ca_intermediates.as_deref(),
        Some(&[0x30, 0x00, 0x30, 0x00][..]),
        "the intermediates read back as enrolled"
    );
    let by_ca = tokenless(s, &e2, Some(&ca), 3).await.unwrap();
    assert_ne!(by_ca.node_id, first.node_id);

    // A machine a token bound gets its node back with no token.
    s.create_token(&token("tpm", Duration::from_secs(600), 1))
        .await
        .unwrap();
    let bound = attested(s, "tpm", &e3, 4).await.unwrap();
    let back = tokenless(s, &e3, None, 5).await.unwrap();
    assert_eq!(
        (back.node_id.as_str(), back.identity_generation),
        (bound.node_id.as_str(), 2)
    );

    // Removing an enrolment admits no new node but keeps the bound one.
    let removed = s.remove_enrolment(&format!("ek:{e1}")).await.unwrap();
    assert_eq!(removed.ek_sha256.as_deref(), Some(e1.as_str()));
    assert!(matches!(
        s.remove_enrolment(&format!("ek:{e1}")).await,
        Err(TxError::Refused(Refusal::NotFound(m))) if m.contains("better-compute machines list")
    ));
    let still = tokenless(s, &e1, None, 6).await.unwrap();
    assert_eq!(
        (still.node_id.as_str(), still.identity_generation),
        (first.node_id.as_str(), 3)
    );
    // Deleting the node frees the EK: not enrolled any more, it is refused.
    s.delete_node(&first.node_id, no_seal()).await.unwrap();
    assert_eq!(
        refusal(tokenless(s, &e1, None, 7).await),
        Refusal::NotEnrolled(e1.clone())
    );
    // The CA's node and the token's are left.
    assert_eq!(s.list_nodes().await.unwrap().nodes.len(), 2);
}

/// Two tokenless joins of one enrolled EK at once, through two processes:
/// one node, bound once; the later join reclaims it.
pub async fn racing_tokenless_joins_of_one_ek_make_one_node(f: Fixture) {
    use bc_store::machines::NewEnrolment;
    const ROUNDS: u8 = 10;
    let (a, b) = (f.store.clone(), f.reopen().await);
    for round in 0..ROUNDS {
        let ek = ek_hash(0x40 + round);
        a.enrol_machine(&NewEnrolment::ek(&ek, "", "").unwrap())
            .await
            .unwrap();
        let (ra, rb) = tokio::join!(
            tokenless(&a, &ek, None, 10 + 2 * round),
            tokenless(&b, &ek, None, 11 + 2 * round)
        );
        let (ja, jb) = (
            ra.unwrap_or_else(|e| panic!("round {round}: {e}")),
            rb.unwrap_or_else(|e| panic!("round {round}: {e}")),
        );
        assert_eq!(ja.node_id, jb.node_id, "round {round}: one node");
        let mut generations = [ja.identity_generation, jb.identity_generation];
        generations.sort_unstable();
        assert_eq!(generations, [1, 2], "round {round}: bound, then reclaimed");
    }
    assert_eq!(
        a.list_nodes().await.unwrap().nodes.len(),
        usize::from(ROUNDS)
    );
}

/// Two machines with one TPM's state (a copied swtpm) re-attest in turn:
/// more than 3 alternations in 10 minutes quarantine the node; reboots of
/// one machine (a new boot id each time) never do. Only an operator's
/// join with a token gets a quarantined node back.
pub async fn machines_alternating_on_one_tpm_identity_are_quarantined(f: Fixture) {
    use bc_store::clones::{DUPLICATE_IDENTITY, QUARANTINED};
    use bc_store::machines::NewEnrolment;
    let s = &f.store;
    let ek = ek_hash(0x77);
    s.enrol_machine(&NewEnrolment::ek(&ek, "", "").unwrap())
        .await
        .unwrap();
    // One machine rebooting many times: the same node every time.
    let mut cert = 1;
    for _ in 0..6 {
        tokenless(s, &ek, None, cert).await.unwrap();
        cert += 1;
    }
    // Two machines: a, c, a, c, a, c: the fourth return quarantines.
    let mut outcomes = Vec::new();
    for boot in ["a", "c", "a", "c", "a", "c"] {
        outcomes.push(reattest(s, &ek, None, boot, cert).await.unwrap());
        cert += 1;
    }
    let node_id = match outcomes.last().unwrap() {
        Enrolled::Quarantined { node_id } => node_id.clone(),
        Enrolled::Joined(j) => panic!("not quarantined: generation {}", j.identity_generation),
        Enrolled::Forged { node_id } => panic!("node {node_id}: binding forged"),
    };
    assert!(
        outcomes[..5]
            .iter()
            .all(|o| matches!(o, Enrolled::Joined(_))),
        "three returns are tolerated"
    );
    // Every certificate of the node is out, with the statement.
    assert_eq!(
        s.check_cert(&format!("fp{}", cert - 2))
            .await
            .unwrap_err()
            .refusal(),
        Some(&Refusal::Revoked(
            DUPLICATE_IDENTITY.into(),
            Some(b"sealed".to_vec())
        ))
    );
    let events = format!("{:?}", s.fleet_events(&node_id, 20).await.unwrap());
    assert!(events.contains(QUARANTINED), "{events}");
    // Committed: no join with no token gets it back, from any boot.
    for boot in ["a", "c", "fresh"] {
        assert_eq!(
            refusal_of(reattest(s, &ek, None, boot, cert).await),
            Refusal::Quarantined(node_id.to_string())
        );
    }
    // An operator joins the real machine with a token: the node is back,
    // and re-attests with no token again from then on.
    s.create_token(&token("real", Duration::from_secs(600), 1))
        .await
        .unwrap();
    let back = attested(s, "real", &ek, 200).await.unwrap();
    assert_eq!(back.node_id, node_id);
    let again = tokenless(s, &ek, None, 201).await.unwrap();
    assert_eq!(again.node_id, node_id);
}

fn refusal_of(r: Result<Enrolled, TxError>) -> Refusal {
    match r {
        Err(TxError::Refused(r)) => r,
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, got a join"),
    }
}

/// Whoever writes the store (a gateway's role among them) cannot undo a
/// certificate's revocation: the database refuses it, so a revoked or
/// quarantined identity cannot be let back in through other gateways.
pub async fn a_revocation_is_never_undone(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    s.delete_node(&node, Box::new(|_| vec![])).await.unwrap();
    for sql in [
        format!("UPDATE node_certs SET revoked_at = NULL WHERE node_id = '{node}'"),
        format!("UPDATE node_certs SET revoked_at = revoked_at + 1 WHERE node_id = '{node}'"),
        format!("UPDATE node_certs SET revoke_reason = 'superseded' WHERE node_id = '{node}'"),
    ] {
        let refused = f.try_tamper(&sql).await.expect_err(&sql);
        assert!(refused.contains("never undone"), "{sql}: {refused}");
    }
    // What the store itself writes over a revocation keeps it (a second
    // deletion's COALESCE), and the certificate stays refused.
    f.tamper(&format!(
        "UPDATE node_certs SET revoked_at = COALESCE(revoked_at, 1) WHERE node_id = '{node}'"
    ))
    .await;
    assert!(
        s.revoked_since(0)
            .await
            .unwrap()
            .iter()
            .any(|r| r.node_id == node)
    );
}

pub async fn unproved_hellos_are_refused_once_a_confirmed_release_proved_them(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let confirmed = |h: bc_store::sessions::HelloInput, seq: u64| {
        let mut h = super::proved(h, seq);
        h.proof.as_mut().expect("proved").release_confirmed = true;
        h
    };
    // An older release proves nothing, an upgrade before its confirmation
    // says it may be swapped back: both connect unproved.
    s.hello(&super::hello(&node, 1, "gw", 0)).await.unwrap();
    s.hello(&super::proved(super::hello(&node, 1, "gw", 1), 1))
        .await
        .unwrap();
    s.hello(&super::proved(super::hello(&node, 1, "gw", 2), 2))
        .await
        .unwrap();
    s.hello(&super::hello(&node, 1, "gw", 3)).await.unwrap();
    // The first proof from a confirmed release is recorded though its boot
    // is the last one seen, so the key holder learns of it.
    s.hello(&confirmed(super::hello(&node, 1, "gw", 4), 3))
        .await
        .unwrap();
    let seen: Vec<(u64, bool)> = s
        .sightings_unwatched(100)
        .await
        .unwrap()
        .iter()
        .map(|x| (x.seq, x.proof.is_empty()))
        .collect();
    assert_eq!(seen, [(1, false), (3, false)]);
    // Nobody verified it yet: an unproved Hello still connects.
    s.hello(&super::hello(&node, 1, "gw", 5)).await.unwrap();
    assert!(s.require_hello_proofs(&node, "serial1").await.unwrap());
    assert!(!s.require_hello_proofs(&node, "serial1").await.unwrap());
    let refused = s.hello(&super::hello(&node, 1, "gw", 6)).await.unwrap_err();
    assert_eq!(
        refused.refusal(),
        Some(&Refusal::HelloUnproved(node.to_string()))
    );
    assert!(refused.to_string().contains("bcd join --reset --yes"));
    // Proved ones go on, and once it is required a confirmed proof of the
    // same boot records nothing more.
    s.hello(&confirmed(super::hello(&node, 1, "gw", 6), 4))
        .await
        .unwrap();
    assert_eq!(s.sightings_unwatched(100).await.unwrap().len(), 2);
    // A re-enrolment is a new identity, maybe of an older release: its
    // unproved Hellos connect, and a proof of the earlier certificate read
    // late does not make them refused.
    s.create_token(&token("re", Duration::from_secs(600), 1))
        .await
        .unwrap();
    reenrol(s, "re", &proof(&node, 1, b"statement"), 2)
        .await
        .unwrap();
    s.hello(&super::hello(&node, 2, "gw", 7)).await.unwrap();
    assert!(!s.require_hello_proofs(&node, "serial1").await.unwrap());
    s.hello(&super::hello(&node, 2, "gw", 8)).await.unwrap();
    assert!(s.require_hello_proofs(&node, "serial2").await.unwrap());
    assert!(s.hello(&super::hello(&node, 2, "gw", 9)).await.is_err());
}
