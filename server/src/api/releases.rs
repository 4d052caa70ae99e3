//! Releases: `RegisterRelease` (only what verifies against a release key
//! and matches its manifest) and `ListReleases`. Gateways hand them to
//! nodes (`crate::gateway::releases`).

use bc_store::Refusal;
use bc_store::ReleaseSeq;
use bc_store::releases::{NewRelease, ReleaseRow};
use bcd_proto::v1::{ListReleasesResponse, RegisterReleaseRequest, ReleaseInfo};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, status, unavailable};

fn info(r: ReleaseRow) -> ReleaseInfo {
    ReleaseInfo {
        version: r.version,
        sequence: r.sequence.get(),
        target: r.target,
        size: r.size,
        sha256: r.sha256,
        key_id: r.key_id,
        registered_at_ms: r.registered_at_ms,
    }
}

pub async fn register(
    svc: &AdminService,
    r: RegisterReleaseRequest,
) -> Result<ReleaseInfo, Status> {
    let signed = release::SignedManifest::parse(&r.signed_manifest)
        .map_err(|e| bad_request(e.to_string()))?;
    if svc.release_keys.is_empty() {
        return Err(refusal(Refusal::Conflict(
            "this server has no release key: start it with --release-pubkey HEX (from releases keygen)"
                .into(),
        )));
    }
    let manifest = signed
        .verify(&svc.release_keys)
        .map_err(|e| bad_request(e.to_string()))?;
    manifest
        .check(&r.binary)
        .map_err(|e| bad_request(e.to_string()))?;
    let row = svc
        .store
        .register_release(&NewRelease {
            sequence: ReleaseSeq::new(manifest.sequence),
            version: manifest.version,
            target: manifest.target,
            size: manifest.size,
            sha256: manifest.sha256,
            key_id: signed.key_id.clone(),
            signed_manifest: r.signed_manifest,
            binary: r.binary,
        })
        .await
        .map_err(status)?;
    info!(version = %row.version, sequence = row.sequence.get(), "release registered");
    Ok(info(row))
}

pub async fn list(svc: &AdminService) -> Result<ListReleasesResponse, Status> {
    let rows = svc.store.list_releases().await.map_err(unavailable)?;
    Ok(ListReleasesResponse {
        releases: rows.into_iter().map(info).collect(),
    })
}
