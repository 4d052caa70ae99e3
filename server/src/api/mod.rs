//! The operator API and the join service: one file per service area, each
//! turning requests into store calls and store rows into replies.
//!
//! The Admin service is served on the operator API's listener only, to
//! client certificates of the operator CA, each call checked against the
//! operator's role in one place ([`auth`]); there is no other way in. Errors reach the operator through the one
//! mapping in [`status`], worded for them; store failures are logged and
//! reported as "unavailable". The gateway is reached only through [`Wake`],
//! so this layer does not depend on it.

pub mod attest;
pub mod auth;
pub mod budget;
pub mod commands;
pub mod events;
pub mod gateway_port;
pub mod gateways;
pub mod images;
pub mod join;
pub mod machines;
pub mod nodes;
pub mod operators;
pub mod releases;
pub mod revoked_operators;
pub mod rollouts;
pub mod secrets;
pub mod specs;
pub mod status;
pub mod tokens;
pub mod tunnels;

use std::sync::Arc;

use bc_store::Store;
use bcd_proto::v1::{self, admin_server::Admin};
use tonic::{Request, Response, Status};

/// The largest request the operator API takes: a release binary fits.
pub const MAX_REQUEST: usize = 128 << 20;

/// Tells the gateway in this process that a node has work (a command, a
/// spec), so its session sends it now rather than at the next poll.
pub trait Wake: Send + Sync + std::fmt::Debug {
    fn wake(&self, node: &str);
    /// The gateway's id.
    fn id(&self) -> &str;
    /// `gateways drain` of this gateway: the sessions told to move.
    fn drain(&self, within: Option<std::time::Duration>) -> usize;
    fn undrain(&self);
}

#[derive(Clone)]
pub struct AdminService {
    pub store: Store,
    pub ca_pin: String,
    /// The join service's seal key, in the tokens it prints.
    pub seal_key: [u8; 32],
    /// The fleet CA certificate (DER), for gateway credentials.
    pub ca_der: Arc<Vec<u8>>,
    /// Digests the secrets of the tokens and gateway credentials it adds.
    pub secrets: crate::pki::ca::SecretDigest,
    pub worker_key: Arc<ring::signature::Ed25519KeyPair>,
    /// Signs exec tickets; its JWKS goes into every spec.
    pub ticket_key: Arc<crate::pki::tickets::TicketKey>,
    /// Seals the secret broker's values (`api::secrets`).
    pub secrets_key: Arc<crate::pki::secrets::SecretsKey>,
    /// Release public keys: what `releases register` accepts.
    pub release_keys: Arc<Vec<Vec<u8>>>,
    /// Image public keys: what `images register` accepts.
    pub image_keys: Arc<Vec<Vec<u8>>>,
    /// The gateway in this process, if any.
    pub gateway: Option<Arc<dyn Wake>>,
    /// Where tunnels to nodes open: the gateway in this process.
    pub tunnels: Option<Arc<dyn tunnels::Relay>>,
    /// The tunnels each operator holds open.
    pub open_tunnels: Arc<tunnels::PerOperator>,
    /// The gateway processes that hold no key, by their streams.
    pub remote_gateways: Arc<tunnels::RemoteTunnels>,
    /// Wakes the rollout controller.
    pub rollouts: Arc<tokio::sync::Notify>,
    /// Wakes the controller that signs the gateway revocation list.
    pub gateway_revocations: Arc<tokio::sync::Notify>,
    /// Signs operators' certificates.
    pub operator_ca: Arc<crate::pki::OperatorCa>,
    /// The operator certificates this key holder knows revoked.
    pub revoked_operators: Arc<revoked_operators::RevokedOperators>,
    /// Where the web console listens (`https://HOST:PORT/`); `None`: off.
    pub console_url: Option<String>,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService").finish_non_exhaustive()
    }
}

impl AdminService {
    fn wake(&self, node: &str) {
        if let Some(gw) = &self.gateway {
            gw.wake(node);
        }
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// The operator `auth::Guarded` admitted for this call.
fn operator<T>(r: &Request<T>) -> Result<auth::Operator, Status> {
    r.extensions()
        .get::<auth::Operator>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no operator admitted this call"))
}

/// The SHA-256 of the certificate the admitted operator called with.
fn operator_cert<T>(r: &Request<T>) -> Result<String, Status> {
    r.extensions()
        .get::<bcd_proto::tls::PeerInfo>()
        .and_then(|p| p.cert_fingerprint.clone())
        .ok_or_else(|| Status::unauthenticated("no operator certificate"))
}

#[tonic::async_trait]
impl Admin for AdminService {
    type TunnelStream = tunnels::TunnelStream;

    async fn tunnel(
        &self,
        r: Request<tonic::Streaming<v1::TunnelClientFrame>>,
    ) -> Reply<Self::TunnelStream> {
        // Admitted by `auth::Guarded`, which names the operator.
        let operator = operator(&r)?;
        let cert = operator_cert(&r)?;
        tunnels::open(self, operator, cert, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn create_token(
        &self,
        r: Request<v1::CreateTokenRequest>,
    ) -> Reply<v1::CreateTokenResponse> {
        tokens::create(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_events(
        &self,
        r: Request<v1::ListEventsRequest>,
    ) -> Reply<v1::ListEventsResponse> {
        events::list(self, r.into_inner()).await.map(Response::new)
    }

    async fn list_tokens(
        &self,
        r: Request<v1::ListTokensRequest>,
    ) -> Reply<v1::ListTokensResponse> {
        tokens::list(self, r.into_inner()).await.map(Response::new)
    }

    async fn revoke_token(&self, r: Request<v1::RevokeTokenRequest>) -> Reply<v1::TokenInfo> {
        tokens::revoke(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn enroll_machine(
        &self,
        r: Request<v1::EnrollMachineRequest>,
    ) -> Reply<v1::EnrollMachineResponse> {
        machines::enrol(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_machines(
        &self,
        _: Request<v1::ListMachinesRequest>,
    ) -> Reply<v1::ListMachinesResponse> {
        machines::list(self).await.map(Response::new)
    }

    async fn remove_machine(&self, r: Request<v1::RemoveMachineRequest>) -> Reply<v1::MachineInfo> {
        machines::remove(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn add_gateway(
        &self,
        r: Request<v1::AddGatewayRequest>,
    ) -> Reply<v1::AddGatewayResponse> {
        gateways::add(self, r.into_inner()).await.map(Response::new)
    }

    async fn list_gateways(
        &self,
        _: Request<v1::ListGatewaysRequest>,
    ) -> Reply<v1::ListGatewaysResponse> {
        gateways::list(self).await.map(Response::new)
    }

    async fn revoke_gateway(&self, r: Request<v1::RevokeGatewayRequest>) -> Reply<v1::GatewayInfo> {
        gateways::revoke(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn put_secret(&self, r: Request<v1::PutSecretRequest>) -> Reply<v1::SecretInfo> {
        let operator = operator(&r)?;
        secrets::put(self, &operator.name, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_secrets(
        &self,
        _: Request<v1::ListSecretsRequest>,
    ) -> Reply<v1::ListSecretsResponse> {
        secrets::list(self).await.map(Response::new)
    }

    async fn delete_secret(&self, r: Request<v1::DeleteSecretRequest>) -> Reply<v1::SecretInfo> {
        secrets::delete(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn rotate_ticket_keys(
        &self,
        _: Request<v1::RotateTicketKeysRequest>,
    ) -> Reply<v1::RotateTicketKeysResponse> {
        tunnels::rotate_keys(self).await.map(Response::new)
    }

    async fn list_nodes(&self, r: Request<v1::ListNodesRequest>) -> Reply<v1::ListNodesResponse> {
        nodes::list(self, r.into_inner()).await.map(Response::new)
    }

    async fn delete_node(
        &self,
        r: Request<v1::DeleteNodeRequest>,
    ) -> Reply<v1::DeleteNodeResponse> {
        nodes::delete(self, r.into_inner()).await.map(Response::new)
    }

    async fn run_command(&self, r: Request<v1::RunCommandRequest>) -> Reply<v1::CommandInfo> {
        commands::run(self, r.into_inner()).await.map(Response::new)
    }

    async fn list_commands(
        &self,
        r: Request<v1::ListCommandsRequest>,
    ) -> Reply<v1::ListCommandsResponse> {
        commands::list(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_command(&self, r: Request<v1::GetCommandRequest>) -> Reply<v1::CommandInfo> {
        commands::get(self, r.into_inner()).await.map(Response::new)
    }

    async fn assign_gpus(&self, r: Request<v1::AssignGpusRequest>) -> Reply<v1::NodeSpecInfo> {
        let r = r.into_inner();
        let held = secrets::resolve(self, r.secrets.clone()).await?;
        specs::assign_gpus(self, r, held).await.map(Response::new)
    }

    async fn unassign(&self, r: Request<v1::UnassignRequest>) -> Reply<v1::NodeSpecInfo> {
        specs::unassign(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_node_spec(&self, r: Request<v1::GetNodeSpecRequest>) -> Reply<v1::NodeSpecInfo> {
        specs::info(self, r.into_inner().node_id)
            .await
            .map(Response::new)
    }

    async fn get_node_inventory(
        &self,
        r: Request<v1::GetNodeInventoryRequest>,
    ) -> Reply<v1::NodeInventory> {
        nodes::inventory(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn set_access(&self, r: Request<v1::SetAccessRequest>) -> Reply<v1::NodeSpecInfo> {
        specs::set_access(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn label_node(&self, r: Request<v1::LabelNodeRequest>) -> Reply<v1::NodeSpecInfo> {
        specs::label(self, r.into_inner()).await.map(Response::new)
    }

    async fn cordon_node(&self, r: Request<v1::CordonNodeRequest>) -> Reply<v1::NodeSpecInfo> {
        specs::cordon(self, r.into_inner()).await.map(Response::new)
    }

    async fn drain_gateway(
        &self,
        r: Request<v1::DrainGatewayRequest>,
    ) -> Reply<v1::DrainGatewayResponse> {
        gateways::drain(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn register_release(
        &self,
        r: Request<v1::RegisterReleaseRequest>,
    ) -> Reply<v1::ReleaseInfo> {
        releases::register(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_releases(
        &self,
        _: Request<v1::ListReleasesRequest>,
    ) -> Reply<v1::ListReleasesResponse> {
        releases::list(self).await.map(Response::new)
    }

    async fn start_rollout(&self, r: Request<v1::StartRolloutRequest>) -> Reply<v1::RolloutInfo> {
        rollouts::start(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_rollouts(
        &self,
        _: Request<v1::ListRolloutsRequest>,
    ) -> Reply<v1::ListRolloutsResponse> {
        rollouts::list(self).await.map(Response::new)
    }

    async fn get_rollout(&self, r: Request<v1::GetRolloutRequest>) -> Reply<v1::RolloutInfo> {
        rollouts::get(self, r.into_inner().id)
            .await
            .map(Response::new)
    }

    async fn change_rollout(&self, r: Request<v1::ChangeRolloutRequest>) -> Reply<v1::RolloutInfo> {
        rollouts::change(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn upload_image(
        &self,
        r: Request<tonic::Streaming<v1::ImageUpload>>,
    ) -> Reply<v1::ImageInfo> {
        images::upload(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn register_image(&self, r: Request<v1::RegisterImageRequest>) -> Reply<v1::ImageInfo> {
        images::register(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_images(
        &self,
        _: Request<v1::ListImagesRequest>,
    ) -> Reply<v1::ListImagesResponse> {
        images::list(self).await.map(Response::new)
    }

    async fn assign_image(
        &self,
        r: Request<v1::AssignImageRequest>,
    ) -> Reply<v1::AssignImageResponse> {
        images::assign(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_boots(&self, r: Request<v1::ListBootsRequest>) -> Reply<v1::ListBootsResponse> {
        images::boots(self, r.into_inner()).await.map(Response::new)
    }

    async fn set_boot_mac(
        &self,
        r: Request<v1::SetBootMacRequest>,
    ) -> Reply<v1::ListBootMacsResponse> {
        images::set_boot_mac(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_boot_macs(
        &self,
        _r: Request<v1::ListBootMacsRequest>,
    ) -> Reply<v1::ListBootMacsResponse> {
        images::boot_macs(self).await.map(Response::new)
    }

    async fn add_operator(
        &self,
        r: Request<v1::AddOperatorRequest>,
    ) -> Reply<v1::AddOperatorResponse> {
        operators::add(self, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_operators(
        &self,
        _: Request<v1::ListOperatorsRequest>,
    ) -> Reply<v1::ListOperatorsResponse> {
        operators::list(self).await.map(Response::new)
    }

    async fn mint_console_token(
        &self,
        r: Request<v1::MintConsoleTokenRequest>,
    ) -> Reply<v1::MintConsoleTokenResponse> {
        let operator = operator(&r)?;
        let cert = operator_cert(&r)?;
        operators::mint_console_token(self, &operator, &cert, r.into_inner())
            .await
            .map(Response::new)
    }

    async fn revoke_operator(
        &self,
        r: Request<v1::RevokeOperatorRequest>,
    ) -> Reply<v1::OperatorInfo> {
        operators::revoke(self, r.into_inner())
            .await
            .map(Response::new)
    }
}
