//! The operator API. Every call carries the operator's bearer credential
//! (written to `operator.json` at first start); there is no other way in.
//! Errors never carry SQL, paths or backtraces: store failures are logged
//! here and reported as "unavailable".

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bcd_proto::token::JoinToken;
use bcd_proto::v1::{
    AssignGpusRequest, CommandInfo, CreateTokenRequest, CreateTokenResponse, DeleteNodeRequest,
    DeleteNodeResponse, GetCommandRequest, GetNodeSpecRequest, ListCommandsRequest,
    ListCommandsResponse, ListNodesRequest, ListNodesResponse, NodeInfo, NodeSpecInfo,
    RunCommandRequest, SectionStatus, UnassignRequest, admin_server::Admin,
};
use prost::Message;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::gateway::{GatewayState, refusal_status};
use crate::store::{Assignment, CommandRow, NewToken, Refusal, Store, StoreError};

/// Checks the bearer credential against the operators known at start.
#[derive(Debug, Clone)]
pub struct OperatorAuth {
    pub token_hashes: Arc<HashSet<String>>,
}

impl tonic::service::Interceptor for OperatorAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let token = request
            .metadata()
            .get(bcd_proto::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Status::unauthenticated(
                    "the operator API needs the operator credential (operator.json in the \
                     server's data directory)",
                )
            })?;
        if !self
            .token_hashes
            .contains(&bcd_proto::fingerprint(token.as_bytes()))
        {
            return Err(Status::unauthenticated(
                "the operator credential is not valid",
            ));
        }
        Ok(request)
    }
}

#[derive(Clone)]
pub struct AdminService {
    pub store: Store,
    pub ca_pin: String,
    pub worker_key: Arc<ring::signature::Ed25519KeyPair>,
    /// Release public keys: what `releases register` accepts.
    pub release_keys: Arc<Vec<Vec<u8>>>,
    /// Image public keys: what `images register` accepts.
    pub image_keys: Arc<Vec<Vec<u8>>>,
    /// The gateway in this process, woken when a command is created.
    pub gateway: Option<Arc<GatewayState>>,
    /// Wakes the rollout controller.
    pub rollouts: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService").finish_non_exhaustive()
    }
}

fn valid_allocation(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl AdminService {
    async fn rollout_info(
        &self,
        id: String,
    ) -> Result<Response<bcd_proto::v1::RolloutInfo>, Status> {
        let i = id.clone();
        let r = self
            .store
            .run(move |s| s.rollout(&i))
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                Status::not_found(format!(
                    "no rollout {id}: see better-compute rollouts status"
                ))
            })?;
        Ok(Response::new(rollout_info(r)))
    }

    async fn wake_rollouts(&self) {
        self.rollouts.notify_one();
    }
    /// Changes a node's spec and signs the new generation; wakes the node's
    /// gateway session to send it.
    async fn change_spec(
        &self,
        node: String,
        change: impl FnOnce(&mut crate::store::SpecBody) -> Result<(), Refusal> + Send + 'static,
    ) -> Result<NodeSpecInfo, Status> {
        let key = self.worker_key.clone();
        let n = node.clone();
        self.store
            .run(move |s| {
                s.update_spec(&n, change, |generation, now, body| {
                    let spec = crate::specs::payload(&n, generation, now, body);
                    bcd_proto::sign::seal(&key, spec.encode_to_vec())
                })
            })
            .await
            .map_err(|e| match e {
                crate::store::TxError::Refused(Refusal::NoSuchNode(n)) => {
                    Status::not_found(format!("no node {n}: see better-compute nodes list"))
                }
                e => refusal_status(e),
            })?;
        if let Some(gw) = &self.gateway {
            gw.wake(&node);
        }
        self.spec_info(node).await
    }

    async fn spec_info(&self, node: String) -> Result<NodeSpecInfo, Status> {
        let n = node.clone();
        let (bindings, events) = self
            .store
            .run(move |s| Ok::<_, StoreError>((s.bindings(&n)?, s.fleet_events(&n, 20)?)))
            .await
            .map_err(unavailable)?;
        let n = node.clone();
        let view = self
            .store
            .run(move |s| s.spec_view(&n))
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                Status::not_found(format!("no node {node}: see better-compute nodes list"))
            })?;
        Ok(NodeSpecInfo {
            node_id: node,
            desired_generation: view.desired_generation,
            applied_generation: view.applied_generation,
            assignments: view
                .assignments
                .into_iter()
                .map(crate::specs::to_wire)
                .collect(),
            access: Some(crate::specs::access_to_wire(&view.access)),
            bindings: bindings
                .into_iter()
                .map(|b| bcd_proto::v1::BindingInfo {
                    allocation_id: b.allocation_id,
                    gpu_uuids: b.gpus,
                    state: b.state,
                    spec_generation: b.spec_generation,
                })
                .collect(),
            events,
            sections: view
                .sections
                .into_iter()
                .map(|s| SectionStatus {
                    section: s.section,
                    status: s.status,
                    message: s.message,
                    age_ms: (view.now_ms - s.since_ms).max(0) as u64,
                })
                .collect(),
            reported_age_ms: view.reported_age_ms.unwrap_or(-1),
        })
    }
}

fn rollout_info(r: crate::rollouts::Rollout) -> bcd_proto::v1::RolloutInfo {
    bcd_proto::v1::RolloutInfo {
        id: r.id,
        sequence: r.sequence,
        version: r.version,
        selector: r.selector,
        waves: r.waves,
        max_failures: r.max_failures,
        state: r.state,
        wave: r.wave as u32,
        reason: r.reason,
        created_at_ms: r.created_at_ms,
        nodes: r
            .nodes
            .into_iter()
            .map(|n| bcd_proto::v1::RolloutNode {
                node_id: n.node_id,
                position: n.position as u32,
                status: n.status.name().to_string(),
                command_id: n.command_id.unwrap_or_default(),
                reason: n.reason,
                rollback_command_id: n.rollback_id.unwrap_or_default(),
            })
            .collect(),
    }
}

fn release_info(r: crate::store::ReleaseRow) -> bcd_proto::v1::ReleaseInfo {
    bcd_proto::v1::ReleaseInfo {
        version: r.version,
        sequence: r.sequence,
        target: r.target,
        size: r.size,
        sha256: r.sha256,
        key_id: r.key_id,
        registered_at_ms: r.registered_at_ms,
    }
}

/// The largest request the operator API takes: a release binary fits.
pub const MAX_REQUEST: usize = 128 << 20;

/// Default deadline of a command.
pub const DEFAULT_NOT_AFTER: Duration = Duration::from_secs(3600);

fn info(c: CommandRow) -> CommandInfo {
    CommandInfo {
        command_id: c.id,
        node_id: c.node_id,
        seq: c.seq,
        kind: c.kind,
        summary: c.summary,
        state: c.state,
        reason: c.reason,
        exit_code: c.exit_code.unwrap_or(0),
        has_exit_code: c.exit_code.is_some(),
        output: c.output,
        output_truncated: c.output_truncated,
        created_at_ms: c.created_at_ms,
        not_after_ms: c.not_after_ms,
        result_at_ms: c.result_at_ms.unwrap_or(0),
        epoch: c.epoch,
    }
}

fn unavailable(e: StoreError) -> Status {
    warn!(error = %format!("{e:#}"), "store error");
    Status::unavailable("the server's store is unavailable; retry later")
}

pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(365 * 86_400);

#[tonic::async_trait]
impl Admin for AdminService {
    async fn create_token(
        &self,
        request: Request<CreateTokenRequest>,
    ) -> Result<Response<CreateTokenResponse>, Status> {
        let r = request.into_inner();
        let ttl = if r.ttl_ms == 0 {
            Duration::from_secs(24 * 3600)
        } else {
            Duration::from_millis(r.ttl_ms)
        };
        if ttl > MAX_TOKEN_TTL {
            return Err(Status::invalid_argument(
                "a join token lives at most 365 days",
            ));
        }
        let uses = if r.uses == 0 { 1 } else { r.uses };
        if uses > 1_000_000 {
            return Err(Status::invalid_argument(
                "a join token has at most 1000000 uses",
            ));
        }
        let token = JoinToken {
            id: format!("{:016x}", rand::random::<u64>()),
            secret: format!("{:032x}", rand::random::<u128>()),
            ca_pin: self.ca_pin.clone(),
        };
        let (id, hash, desc) = (
            token.id.clone(),
            bcd_proto::fingerprint(token.secret.as_bytes()),
            r.description,
        );
        let expires_at_ms = self
            .store
            .run(move |s| {
                s.create_token(&NewToken {
                    id: &id,
                    secret_sha256: &hash,
                    ttl,
                    uses,
                    description: &desc,
                })
            })
            .await
            .map_err(unavailable)?;
        info!(token = %token.id, uses, ?ttl, "join token created");
        Ok(Response::new(CreateTokenResponse {
            token_id: token.id.clone(),
            token: token.to_string(),
            expires_at_ms,
            uses,
        }))
    }

    async fn list_nodes(
        &self,
        _request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        let (rows, now) = self
            .store
            .run(|s| s.list_nodes())
            .await
            .map_err(unavailable)?;
        Ok(Response::new(ListNodesResponse {
            server_time_ms: now,
            nodes: rows
                .into_iter()
                .map(|n| NodeInfo {
                    node_id: n.node_id,
                    hostname: n.hostname,
                    state: n.state,
                    epoch: n.epoch,
                    gateway_id: n.gateway_id,
                    cert_not_after_ms: n.cert_not_after_ms,
                    last_seen_age_ms: n.last_seen_age_ms,
                    boot_id: n.boot_id,
                    journal_id: n.journal_id,
                    incarnation_id: n.incarnation_id,
                    conditions: n.conditions,
                    taints: n.taints,
                    agent_version: n.agent_version,
                    release_floor: n.release_floor,
                    server_time_ms: now,
                })
                .collect(),
        }))
    }

    async fn delete_node(
        &self,
        request: Request<DeleteNodeRequest>,
    ) -> Result<Response<DeleteNodeResponse>, Status> {
        let node = request.into_inner().node_id;
        let n = node.clone();
        let deleted = self
            .store
            .run(move |s| s.delete_node(&n))
            .await
            .map_err(unavailable)?;
        if !deleted {
            return Err(Status::not_found(format!(
                "no node {node}: see better-compute nodes list"
            )));
        }
        info!(%node, "node deleted");
        Ok(Response::new(DeleteNodeResponse {}))
    }

    async fn run_command(
        &self,
        request: Request<RunCommandRequest>,
    ) -> Result<Response<CommandInfo>, Status> {
        let r = request.into_inner();
        let (kind, args, summary) = crate::commands::parse(&r.kind, &r.args, r.timeout_ms)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let not_after = if r.not_after_ms == 0 {
            DEFAULT_NOT_AFTER
        } else {
            Duration::from_millis(r.not_after_ms)
        };
        let key = self.worker_key.clone();
        let (node, min_generation) = (r.node_id.clone(), r.min_generation);
        let idem = (!r.idempotency_key.is_empty()).then_some(r.idempotency_key);
        let (row, created) = self
            .store
            .run(move |s| {
                crate::commands::create_signed(
                    s,
                    &key,
                    &node,
                    kind,
                    args,
                    &summary,
                    not_after,
                    min_generation,
                    idem.as_deref(),
                )
            })
            .await
            .map_err(|e| match e {
                crate::store::TxError::Refused(crate::store::Refusal::NoSuchNode(n)) => {
                    Status::not_found(format!("no node {n}: see better-compute nodes list"))
                }
                e => refusal_status(e),
            })?;
        if created {
            info!(cmd = %row.id, node = %row.node_id, kind = %row.kind, seq = row.seq, "command created");
            if let Some(gw) = &self.gateway {
                gw.wake(&row.node_id);
            }
        }
        Ok(Response::new(info(row)))
    }

    async fn list_commands(
        &self,
        request: Request<ListCommandsRequest>,
    ) -> Result<Response<ListCommandsResponse>, Status> {
        let r = request.into_inner();
        let node = (!r.node_id.is_empty()).then_some(r.node_id);
        let limit = if r.limit == 0 {
            100
        } else {
            r.limit.min(10_000)
        };
        let rows = self
            .store
            .run(move |s| s.list_commands(node.as_deref(), limit))
            .await
            .map_err(unavailable)?;
        Ok(Response::new(ListCommandsResponse {
            commands: rows.into_iter().map(info).collect(),
        }))
    }

    async fn assign_gpus(
        &self,
        request: Request<AssignGpusRequest>,
    ) -> Result<Response<NodeSpecInfo>, Status> {
        let r = request.into_inner();
        if !valid_allocation(&r.allocation_id) {
            return Err(Status::invalid_argument(format!(
                "allocation id {:?} must be 1-64 letters, digits, '-', '_' or '.'",
                r.allocation_id
            )));
        }
        if r.gpus.is_empty() || r.gpus.iter().any(|g| g.is_empty()) {
            return Err(Status::invalid_argument(
                "name at least one GPU, by UUID or index",
            ));
        }
        for k in r.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\n') {
                return Err(Status::invalid_argument(format!(
                    "{k:?} is not an environment variable name"
                )));
            }
        }
        let info = self
            .change_spec(r.node_id.clone(), move |body| {
                let assignments = &mut body.assignments;
                // A GPU is bound to one allocation at a time.
                for a in assignments.iter() {
                    if a.allocation_id == r.allocation_id {
                        continue;
                    }
                    if let Some(g) = r.gpus.iter().find(|g| a.gpus.contains(g)) {
                        return Err(Refusal::BadRequest(format!(
                            "GPU {g} is already assigned to allocation {} on this node",
                            a.allocation_id
                        )));
                    }
                }
                assignments.retain(|a| a.allocation_id != r.allocation_id);
                assignments.push(Assignment {
                    allocation_id: r.allocation_id,
                    gpus: r.gpus,
                    env: r.env.into_iter().collect(),
                });
                assignments.sort_by(|a, b| a.allocation_id.cmp(&b.allocation_id));
                Ok(())
            })
            .await?;
        info!(node = %info.node_id, generation = info.desired_generation, "GPUs assigned");
        Ok(Response::new(info))
    }

    async fn unassign(
        &self,
        request: Request<UnassignRequest>,
    ) -> Result<Response<NodeSpecInfo>, Status> {
        let r = request.into_inner();
        let info = self
            .change_spec(r.node_id.clone(), move |body| {
                let assignments = &mut body.assignments;
                let before = assignments.len();
                assignments.retain(|a| a.allocation_id != r.allocation_id);
                if assignments.len() == before {
                    return Err(Refusal::BadRequest(format!(
                        "no allocation {} on this node: see better-compute nodes spec",
                        r.allocation_id
                    )));
                }
                Ok(())
            })
            .await?;
        Ok(Response::new(info))
    }

    async fn set_access(
        &self,
        request: Request<bcd_proto::v1::SetAccessRequest>,
    ) -> Result<Response<NodeSpecInfo>, Status> {
        let r = request.into_inner();
        let a = r.access.unwrap_or_default();
        let access = crate::store::Access {
            users: a
                .users
                .into_iter()
                .map(|u| crate::store::AccessUser {
                    name: u.name,
                    authorized_keys: u.authorized_keys,
                    principals: u.principals,
                })
                .collect(),
            trusted_user_ca_keys: a.trusted_user_ca_keys,
            firewall: a.firewall.map(|f| crate::store::Firewall {
                rules: f
                    .rules
                    .into_iter()
                    .map(|r| crate::store::FirewallRule {
                        protocol: r.protocol,
                        port: r.port,
                        source: r.source,
                        action: r.action,
                    })
                    .collect(),
            }),
        };
        let info = self
            .change_spec(r.node_id, move |body| {
                body.access = access;
                Ok(())
            })
            .await?;
        info!(node = %info.node_id, generation = info.desired_generation, "access set");
        Ok(Response::new(info))
    }

    async fn register_release(
        &self,
        request: Request<bcd_proto::v1::RegisterReleaseRequest>,
    ) -> Result<Response<bcd_proto::v1::ReleaseInfo>, Status> {
        let r = request.into_inner();
        let signed = release::SignedManifest::parse(&r.signed_manifest)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if self.release_keys.is_empty() {
            return Err(Status::failed_precondition(
                "this server has no release key: start it with --release-pubkey HEX (from releases keygen)",
            ));
        }
        let manifest = signed
            .verify(&self.release_keys)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        manifest
            .check(&r.binary)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let key_id = signed.key_id.clone();
        let row = self
            .store
            .run(move |s| s.register_release(&manifest, &key_id, &r.signed_manifest, &r.binary))
            .await
            .map_err(refusal_status)?;
        info!(version = %row.version, sequence = row.sequence, "release registered");
        Ok(Response::new(release_info(row)))
    }

    async fn list_releases(
        &self,
        _request: Request<bcd_proto::v1::ListReleasesRequest>,
    ) -> Result<Response<bcd_proto::v1::ListReleasesResponse>, Status> {
        let rows = self
            .store
            .run(|s| s.list_releases())
            .await
            .map_err(unavailable)?;
        Ok(Response::new(bcd_proto::v1::ListReleasesResponse {
            releases: rows.into_iter().map(release_info).collect(),
        }))
    }

    async fn start_rollout(
        &self,
        request: Request<bcd_proto::v1::StartRolloutRequest>,
    ) -> Result<Response<bcd_proto::v1::RolloutInfo>, Status> {
        let r = request.into_inner();
        let waves = if r.waves.is_empty() {
            crate::rollouts::DEFAULT_WAVES.to_vec()
        } else {
            r.waves
        };
        let rollout = self
            .store
            .run(move |s| s.start_rollout(r.sequence, &r.selector, &waves, r.max_failures))
            .await
            .map_err(refusal_status)?;
        info!(rollout = %rollout.id, sequence = rollout.sequence, nodes = rollout.nodes.len(), "rollout started");
        self.wake_rollouts().await;
        let id = rollout.id.clone();
        self.rollout_info(id).await
    }

    async fn list_rollouts(
        &self,
        _request: Request<bcd_proto::v1::ListRolloutsRequest>,
    ) -> Result<Response<bcd_proto::v1::ListRolloutsResponse>, Status> {
        let rows = self
            .store
            .run(|s| s.list_rollouts())
            .await
            .map_err(unavailable)?;
        Ok(Response::new(bcd_proto::v1::ListRolloutsResponse {
            rollouts: rows.into_iter().map(rollout_info).collect(),
        }))
    }

    async fn get_rollout(
        &self,
        request: Request<bcd_proto::v1::GetRolloutRequest>,
    ) -> Result<Response<bcd_proto::v1::RolloutInfo>, Status> {
        self.rollout_info(request.into_inner().id).await
    }

    async fn change_rollout(
        &self,
        request: Request<bcd_proto::v1::ChangeRolloutRequest>,
    ) -> Result<Response<bcd_proto::v1::RolloutInfo>, Status> {
        let r = request.into_inner();
        let change = match r.action.as_str() {
            "pause" => crate::rollouts::Change::Pause,
            "resume" => crate::rollouts::Change::Resume,
            "abort" => crate::rollouts::Change::Abort {
                rollback: r.rollback,
            },
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown rollout action {other:?}: pause, resume or abort"
                )));
            }
        };
        let key = self.worker_key.clone();
        let id = r.id.clone();
        let rolled_back = self
            .store
            .run(move |s| crate::rollouts::change(s, &key, &id, change))
            .await
            .map_err(refusal_status)?;
        info!(rollout = %r.id, action = %r.action, rolled_back = rolled_back.len(), "rollout changed");
        if let Some(gw) = &self.gateway {
            for n in &rolled_back {
                gw.wake(n);
            }
        }
        self.wake_rollouts().await;
        self.rollout_info(r.id).await
    }

    async fn get_node_spec(
        &self,
        request: Request<GetNodeSpecRequest>,
    ) -> Result<Response<NodeSpecInfo>, Status> {
        Ok(Response::new(
            self.spec_info(request.into_inner().node_id).await?,
        ))
    }

    async fn get_command(
        &self,
        request: Request<GetCommandRequest>,
    ) -> Result<Response<CommandInfo>, Status> {
        let id = request.into_inner().command_id;
        let i = id.clone();
        let row = self
            .store
            .run(move |s| s.get_command(&i))
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                Status::not_found(format!("no command {id}: see better-compute commands list"))
            })?;
        Ok(Response::new(info(row)))
    }
    async fn register_image(
        &self,
        request: Request<bcd_proto::v1::RegisterImageRequest>,
    ) -> Result<Response<bcd_proto::v1::ImageInfo>, Status> {
        crate::images::register(self, request).await
    }

    async fn list_images(
        &self,
        request: Request<bcd_proto::v1::ListImagesRequest>,
    ) -> Result<Response<bcd_proto::v1::ListImagesResponse>, Status> {
        crate::images::list(self, request).await
    }

    async fn assign_image(
        &self,
        request: Request<bcd_proto::v1::AssignImageRequest>,
    ) -> Result<Response<bcd_proto::v1::AssignImageResponse>, Status> {
        crate::images::assign(self, request).await
    }

    async fn list_boots(
        &self,
        request: Request<bcd_proto::v1::ListBootsRequest>,
    ) -> Result<Response<bcd_proto::v1::ListBootsResponse>, Status> {
        crate::images::boots(self, request).await
    }
}
