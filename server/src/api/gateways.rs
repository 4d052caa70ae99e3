//! Gateway credentials: `AddGateway`, `ListGateways`, `RevokeGateway`.

use bc_store::GatewayId;
use bc_store::gateways::{GatewayCredential, valid_name};
use bcd_proto::v1::{
    AddGatewayRequest, AddGatewayResponse, GatewayInfo, ListGatewaysResponse, RevokeGatewayRequest,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, status, unavailable};

fn info(c: GatewayCredential) -> GatewayInfo {
    GatewayInfo {
        name: c.name.into_string(),
        created_at_ms: c.created_ms,
        revoked_at_ms: c.revoked_ms.unwrap_or(0),
    }
}

pub async fn add(svc: &AdminService, r: AddGatewayRequest) -> Result<AddGatewayResponse, Status> {
    if !valid_name(&r.name) {
        return Err(bad_request(
            "a gateway name is 1 to 63 of a-z, 0-9 and -, not starting with -",
        ));
    }
    let secret = format!(
        "bcg1.{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    let created = svc
        .store
        .add_gateway_credential(&GatewayId::from(&r.name), &svc.secrets.of(&secret))
        .await
        .map_err(status)?;
    info!(gateway = %r.name, "gateway credential added");
    let database_role_sql = svc
        .store
        .gateway_role_sql(&GatewayId::from(&r.name))
        .await
        .map_err(unavailable)?
        .unwrap_or_default();
    Ok(AddGatewayResponse {
        gateway: Some(GatewayInfo {
            name: r.name,
            created_at_ms: created,
            revoked_at_ms: 0,
        }),
        secret,
        ca_der: svc.ca_der.as_ref().clone(),
        database_role_sql,
    })
}

pub async fn list(svc: &AdminService) -> Result<ListGatewaysResponse, Status> {
    let gateways = svc
        .store
        .list_gateway_credentials()
        .await
        .map_err(unavailable)?;
    Ok(ListGatewaysResponse {
        gateways: gateways.into_iter().map(info).collect(),
    })
}

pub async fn revoke(svc: &AdminService, r: RevokeGatewayRequest) -> Result<GatewayInfo, Status> {
    let store = &svc.store;
    if !store
        .revoke_gateway_credential(&GatewayId::from(&r.name))
        .await
        .map_err(unavailable)?
    {
        return Err(refusal(bc_store::Refusal::NotFound(format!(
            "no live credential for gateway {}: see better-compute gateways list",
            r.name
        ))));
    }
    info!(gateway = %r.name, "gateway credential revoked");
    // Its certificates go into the list nodes are handed, signed now.
    svc.gateway_revocations.notify_one();
    let c = store
        .gateway_credential(&GatewayId::from(&r.name))
        .await
        .map_err(unavailable)?
        .ok_or_else(|| {
            refusal(bc_store::Refusal::NotFound(format!(
                "no gateway {}",
                r.name
            )))
        })?;
    Ok(info(c))
}

/// The longest drain window an operator may ask for.
pub const MAX_DRAIN_WITHIN: std::time::Duration = std::time::Duration::from_secs(600);

/// `DrainGateway`: the key holder's own gateway directly, a gateway
/// process through the request stream it holds open.
pub async fn drain(
    svc: &AdminService,
    r: bcd_proto::v1::DrainGatewayRequest,
) -> Result<bcd_proto::v1::DrainGatewayResponse, Status> {
    let within = std::time::Duration::from_millis(r.within_ms);
    if within > MAX_DRAIN_WITHIN {
        return Err(bad_request(format!(
            "drain within at most {} s",
            MAX_DRAIN_WITHIN.as_secs()
        )));
    }
    let within = (!within.is_zero()).then_some(within);
    if let Some(gw) = svc.gateway.as_ref().filter(|g| g.id() == r.gateway_id) {
        let sessions = if r.undo {
            gw.undrain();
            0
        } else {
            gw.drain(within) as i64
        };
        info!(gateway = %r.gateway_id, undo = r.undo, sessions, "drain asked");
        return Ok(bcd_proto::v1::DrainGatewayResponse { sessions });
    }
    let order = bcd_proto::v1::GatewayDrain {
        drain: !r.undo,
        within_ms: r.within_ms,
    };
    if svc.remote_gateways.drain(&r.gateway_id, order).await == 0 {
        return Err(refusal(bc_store::Refusal::NotFound(format!(
            "no running gateway {} reaches this key holder: nodes list shows the gateways \
             holding sessions",
            r.gateway_id
        ))));
    }
    info!(gateway = %r.gateway_id, undo = r.undo, "drain sent");
    Ok(bcd_proto::v1::DrainGatewayResponse { sessions: -1 })
}
