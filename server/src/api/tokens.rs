//! Join tokens: `CreateToken`, `ListTokens`, `RevokeToken`.

use bc_store::TokenId;
use std::time::Duration;

use bc_store::tokens::{NewToken, TokenInfo};
use bcd_proto::token::JoinToken;
use bcd_proto::v1::{
    self, CreateTokenRequest, CreateTokenResponse, ListTokensRequest, ListTokensResponse,
    RevokeTokenRequest,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, unavailable};

pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
pub const MAX_TTL: Duration = Duration::from_secs(365 * 86_400);
pub const MAX_USES: u32 = 1_000_000;

pub async fn create(
    svc: &AdminService,
    r: CreateTokenRequest,
) -> Result<CreateTokenResponse, Status> {
    let ttl = if r.ttl_ms == 0 {
        DEFAULT_TTL
    } else {
        Duration::from_millis(r.ttl_ms)
    };
    if ttl > MAX_TTL {
        return Err(bad_request("a join token lives at most 365 days"));
    }
    let uses = if r.uses == 0 { 1 } else { r.uses };
    if uses > MAX_USES {
        return Err(bad_request("a join token has at most 1000000 uses"));
    }
    let pool = pool_name(&r.pool)?;
    let token = fresh(&svc.ca_pin, svc.seal_key);
    let expires_at_ms = svc
        .store
        .create_token(&NewToken {
            id: TokenId::from(token.id.clone()),
            secret_sha256: svc.secrets.of(&token.secret),
            ttl,
            uses,
            description: r.description,
            pool: pool.clone(),
        })
        .await
        .map_err(unavailable)?;
    info!(token = %token.id, uses, ?ttl, ?pool, "join token created");
    Ok(CreateTokenResponse {
        token_id: token.id.clone(),
        token: token.to_string(),
        expires_at_ms,
        uses,
        pool: pool.unwrap_or_default(),
    })
}

pub async fn list(svc: &AdminService, r: ListTokensRequest) -> Result<ListTokensResponse, Status> {
    let tokens = svc.store.list_tokens(r.all).await.map_err(unavailable)?;
    Ok(ListTokensResponse {
        tokens: tokens.into_iter().map(info).collect(),
    })
}

pub async fn revoke(svc: &AdminService, r: RevokeTokenRequest) -> Result<v1::TokenInfo, Status> {
    let t = svc
        .store
        .revoke_token(&TokenId::from(&r.token_id))
        .await
        .map_err(unavailable)?
        .ok_or_else(|| {
            refusal(bc_store::Refusal::NotFound(format!(
                "no join token {:?}: better-compute tokens list --all shows them (a token's id \
                 is the 16 hex digits after bct1.)",
                r.token_id.chars().take(70).collect::<String>()
            )))
        })?;
    info!(token = %t.id, "join token revoked");
    Ok(info(t))
}

fn info(t: TokenInfo) -> v1::TokenInfo {
    v1::TokenInfo {
        token_id: t.id.into_string(),
        created_at_ms: t.created_at_ms,
        expires_at_ms: t.expires_at_ms,
        uses_total: t.uses_total.clamp(0, i64::from(u32::MAX)) as u32,
        uses_left: t.uses_left.clamp(0, i64::from(u32::MAX)) as u32,
        description: t.description,
        pool: t.pool.unwrap_or_default(),
        minted_for_mac: t.minted_for_mac.unwrap_or_default(),
    }
}

/// A new join token (its id and secret random) for the CA `ca_pin`,
/// sealed to the join service's `seal_key`.
pub fn fresh(ca_pin: &str, seal_key: [u8; 32]) -> JoinToken {
    let (id, secret) = bc_store::tokens::new_token_secret();
    JoinToken {
        id,
        secret,
        ca_pin: ca_pin.to_string(),
        seal_key: Some(seal_key),
    }
}

/// A pool as a request names it: empty for none, else a valid name.
pub fn pool_name(pool: &str) -> Result<Option<String>, Status> {
    if pool.is_empty() {
        return Ok(None);
    }
    if !bc_store::images::valid_pool(pool) {
        return Err(bad_request(format!(
            "{:?} is not a pool name: 1 to 63 of a-z, 0-9, '-', '_' and '.', starting with a \
             letter or digit",
            pool.chars().take(70).collect::<String>()
        )));
    }
    Ok(Some(pool.to_string()))
}
