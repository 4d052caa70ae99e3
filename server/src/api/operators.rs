//! Operators: `AddOperator` (the operator CA signs the caller's request),
//! `ListOperators`, `RevokeOperator`, `MintConsoleToken`. Who may call them is decided in
//! [`super::auth`], like every other call.

use bc_store::OperatorId;
use bc_store::tokens::{NewOperator, OperatorRow};
use bcd_proto::v1::{
    AddOperatorRequest, AddOperatorResponse, ListOperatorsResponse, MintConsoleTokenRequest,
    MintConsoleTokenResponse, OperatorInfo, RevokeOperatorRequest,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, status, unavailable};
use crate::pki::operator::{role, wire_role};

/// An operator name: 1 to 64 of `a-z 0-9 . _ -`, starting with a letter or
/// digit.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
}

pub fn info(o: &OperatorRow) -> OperatorInfo {
    OperatorInfo {
        name: o.id.to_string(),
        role: wire_role(o.role) as i32,
        cert_sha256: o.cert_sha256.clone().unwrap_or_default(),
        cert_serial: o.cert_serial.clone().unwrap_or_default(),
        created_at_ms: o.created_at,
        not_after_ms: o.not_after.unwrap_or(0),
        revoked_at_ms: o.revoked_at.unwrap_or(0),
    }
}

pub async fn add(svc: &AdminService, r: AddOperatorRequest) -> Result<AddOperatorResponse, Status> {
    if !valid_name(&r.name) {
        return Err(bad_request(
            "an operator name is 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter \
             or digit",
        ));
    }
    let role = role(r.role).ok_or_else(|| {
        bad_request(
            "the request names no role this server knows (admin or read-only); add operators \
             with this release's better-compute",
        )
    })?;
    let now = svc.store.now().await.map_err(unavailable)?;
    let cert = svc
        .operator_ca
        .issue(&r.csr_der, &r.name, role, now)
        .map_err(|_| {
            bad_request("the certificate request is not valid (bad encoding or signature)")
        })?;
    let new = NewOperator {
        id: OperatorId::from(r.name.clone()),
        role,
        cert_sha256: bcd_proto::fingerprint(&cert.der),
        cert_serial: cert.serial.clone(),
        not_after: cert.not_after_ms,
    };
    svc.store.add_operator(&new).await.map_err(status)?;
    info!(operator = %r.name, %role, serial = %cert.serial, "operator added");
    let row = svc
        .store
        .operator_by_cert(&new.cert_sha256)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| Status::unavailable("the new operator is not in the store; retry"))?;
    Ok(AddOperatorResponse {
        operator: Some(info(&row)),
        cert_der: cert.der.to_vec(),
        ca_der: svc.operator_ca.cert.to_vec(),
    })
}

pub async fn list(svc: &AdminService) -> Result<ListOperatorsResponse, Status> {
    let rows = svc.store.list_operators().await.map_err(unavailable)?;
    Ok(ListOperatorsResponse {
        operators: rows.iter().map(info).collect(),
    })
}

/// Revokes an operator: the store keeps the key holder's signed statement
/// naming the certificate beside the row, and this key holder remembers it
/// (`revoked_operators`).
pub async fn revoke(svc: &AdminService, r: RevokeOperatorRequest) -> Result<OperatorInfo, Status> {
    let key = svc.worker_key.clone();
    let seal: bc_store::tokens::SealRevocation = Box::new(move |row, at| {
        bcd_proto::sign::seal_as(
            &key,
            bcd_proto::v1::OperatorRevocation {
                purpose: String::new(),
                name: row.id.to_string(),
                cert_sha256: row.cert_sha256.clone().unwrap_or_default(),
                revoked_at_ms: at,
            },
        )
    });
    let row = svc
        .store
        .revoke_operator(&OperatorId::from(&r.name), seal)
        .await
        .map_err(status)?;
    if let Some(statement) = &row.revocation
        && let Err(why) = svc.revoked_operators.learn(statement)
    {
        tracing::warn!(operator = %r.name, %why, "the stored revocation is not this key holder's");
    }
    info!(operator = %r.name, "operator revoked");
    Ok(info(&row))
}

/// A console token for the calling operator, as its certificate grants
/// (`operator` was admitted by that certificate, `cert` its SHA-256).
pub async fn mint_console_token(
    svc: &AdminService,
    operator: &super::auth::Operator,
    cert: &str,
    r: MintConsoleTokenRequest,
) -> Result<MintConsoleTokenResponse, Status> {
    let Some(console_url) = svc.console_url.clone() else {
        return Err(super::status::refusal(bc_store::Refusal::Conflict(
            "the web console is off on this server: start better-compute serve with \
             --console-listen ADDR (console-listen in its config file)"
                .into(),
        )));
    };
    let mut nonce = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce).map_err(|_| {
        super::status::refusal(bc_store::Refusal::Internal(
            "no randomness for a console token".into(),
        ))
    })?;
    let (token, expires_ms) = crate::pki::console::mint(
        &svc.worker_key,
        &operator.name,
        operator.role,
        cert,
        crate::clock::unix_ms(),
        r.ttl_ms,
        nonce,
    )
    .map_err(bad_request)?;
    info!(operator = %operator.name, expires_ms, "console token minted");
    Ok(MintConsoleTokenResponse {
        token,
        expires_ms,
        console_url,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names_are_plain() {
        for ok in ["admin", "alice", "ops.team-1", "a_b", "7"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "Alice",
            "a b",
            "a/b",
            "a\nb",
            &"a".repeat(65),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
