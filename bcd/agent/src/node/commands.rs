//! Commands, exactly once: a dispatch is judged by
//! `bcd_core::command::on_dispatch`; an accepted command is journaled
//! (fsynced) before anything happens, its sequence written to the replay
//! floor in `identity.json` (which outlives the journal), journaled
//! `running` with the boot id right before its side effect, and its result
//! journaled before it is sent. At start, `bcd_core::command::recover`
//! settles what a previous process left.

use bcd_core::command::{self, DispatchFacts, Kind, NodeView, OnDispatch, Recovery};
use bcd_proto::v1;
use prost::Message;
use std::path::PathBuf;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::conn::{Conn, ack, send};
use super::results::{self, journaled_result};
use super::update;
use super::{Done, Shared, Stage, Staged, Stopped};
use crate::effects::{self, Effect};
use crate::events::{CommandAccepted, CommandRefused, CommandRunning};
use crate::failpoints::Point;
use crate::hw::Gpu;
use crate::identity::ReplayFloors;
use crate::upgrade::Updater;

fn journal_err(e: rusqlite::Error) -> Result<Stopped, String> {
    Err(format!("journal: {e}"))
}

/// What commands own: where their side effects, and what they prepare in
/// the background, go back to the loop, and where a kexec image is
/// fetched to. Apart from `kexec_dir`, which the daemon sets before it
/// runs the agent, this module alone reads or changes it.
#[derive(Debug)]
pub struct Commands {
    /// Where `boot.kexec image=` writes the image it fetches before it
    /// loads it: a memory-backed directory on a real machine (`bcd node`
    /// without a helper sets `<run-dir>/kexec`), since a kernel and initrd
    /// outgrow a small state partition; `<data-dir>/kexec` unless set.
    pub kexec_dir: PathBuf,
    /// Where a finished side effect goes back to the loop.
    done: mpsc::UnboundedSender<Done>,
    /// Where a downloaded release, or an image fetched for `boot.kexec
    /// image=`, goes back to the loop.
    staged: mpsc::UnboundedSender<Staged>,
    /// The loop's ends of both, until it takes them.
    returns: Option<Returns>,
}

/// The loop's ends of the channels commands report on: finished side
/// effects, and what was staged in the background.
pub(super) type Returns = (
    mpsc::UnboundedReceiver<Done>,
    mpsc::UnboundedReceiver<Staged>,
);

impl Commands {
    /// Nothing running yet; images are fetched to `kexec_dir`.
    pub(super) fn new(kexec_dir: PathBuf) -> Commands {
        let (done, done_rx) = mpsc::unbounded_channel();
        let (staged, staged_rx) = mpsc::unbounded_channel();
        Commands {
            kexec_dir,
            done,
            staged,
            returns: Some((done_rx, staged_rx)),
        }
    }

    /// Where side effects and staged work come back, for the loop to read
    /// (once).
    pub(super) fn take_returns(&mut self) -> Option<Returns> {
        self.returns.take()
    }

    /// Judges a dispatch by `bcd_core::command::on_dispatch` and acts on
    /// the decision. `Err(Ok(stopped))` ends the agent (a reboot);
    /// `Err(Err(message))` is a journal failure.
    pub(super) async fn on_dispatch(
        &mut self,
        shared: &mut Shared,
        update: &mut Option<Updater>,
        spec: Option<&v1::NodeSpec>,
        d: v1::CommandDispatch,
        conn: &Conn,
        server_now: Option<i64>,
    ) -> Result<(), Result<Stopped, String>> {
        let journaled = shared.journal.command(&d.command_id).map_err(journal_err)?;
        let opened = bcd_proto::sign::open(&d.signed, &shared.worker_keys());
        let payload = opened
            .as_ref()
            .ok()
            .and_then(|p| v1::CommandPayload::decode(p.as_slice()).ok());
        let kind = payload
            .as_ref()
            .and_then(|p| bcd_proto::typed::kind(p.kind));
        let facts = DispatchFacts {
            signature: match (&opened, &payload) {
                (Err(e), _) => Err(e.to_string()),
                (Ok(_), None) => Err("the payload does not decode".to_string()),
                (Ok(_), Some(p)) if p.command_id != d.command_id || p.seq != d.seq => {
                    Err("the dispatch does not match its signed payload".to_string())
                }
                _ => Ok(()),
            },
            node_id: payload
                .as_ref()
                .map(|p| p.node_id.clone())
                .unwrap_or_default(),
            kind,
            seq: d.seq,
            issued_at_ms: payload.as_ref().map_or(0, |p| p.issued_at_ms),
            not_after_ms: payload.as_ref().map_or(0, |p| p.not_after_ms),
            min_generation: payload.as_ref().map_or(0, |p| p.min_generation),
        };
        let view = NodeView {
            node_id: &shared.identity.file.node_id,
            highest_seq: shared.journal.highest_seq().map_err(journal_err)?,
            seq_floor: shared.identity.file.replay_floors.command_seq,
            server_now_ms: server_now,
            applied_generation: shared.journal.applied_generation().map_err(journal_err)?,
        };
        let decision = command::on_dispatch(journaled.as_ref().map(|e| &e.state), &facts, &view);
        debug!(cmd = %d.command_id, seq = d.seq, ?decision, "dispatch");
        match decision {
            OnDispatch::Accept => {
                let payload = payload.expect("accepted payloads decoded");
                let kind = kind.expect("accepted kinds are known");
                shared
                    .journal
                    .accept(&d.command_id, d.seq, kind.name(), &payload.encode_to_vec())
                    .map_err(journal_err)?;
                shared.failpoints.at(Point::AfterAccept);
                shared.event(&CommandAccepted {
                    command_id: d.command_id.clone(),
                    kind: kind.name().to_string(),
                    seq: d.seq,
                });
                send(conn, ack(&d.command_id, d.seq, v1::AckState::Accepted)).await;
                if let Some(stopped) = self
                    .start(shared, update, spec, &d.command_id, Some(kind), &payload)
                    .map_err(Err)?
                {
                    return Err(Ok(stopped));
                }
            }
            OnDispatch::Reattach => {
                send(conn, ack(&d.command_id, d.seq, v1::AckState::Running)).await
            }
            OnDispatch::ResendResult => {
                if let Some(r) = journaled.and_then(|e| e.result)
                    && let Some(r) = journaled_result(&r)
                {
                    results::send_result(shared, conn, r).await;
                }
            }
            OnDispatch::Reject(rejection) => {
                match &rejection {
                    // What only a gateway's forgery or replay produces.
                    command::Rejection::Signature(_)
                    | command::Rejection::WrongNode(_)
                    | command::Rejection::UnknownKind
                    | command::Rejection::Replayed { .. }
                    | command::Rejection::TooLong { .. } => shared.refused_frame(CommandRefused {
                        command_id: d.command_id.clone(),
                        reason: rejection.to_string(),
                        seq: d.seq,
                    }),
                    command::Rejection::OutOfOrder { .. }
                    | command::Rejection::Expired { .. }
                    | command::Rejection::BelowMinGeneration { .. } => {
                        warn!(cmd = %d.command_id, %rejection, "command rejected")
                    }
                }
                let result = v1::CommandResult {
                    command_id: d.command_id.clone(),
                    seq: d.seq,
                    outcome: v1::Outcome::from(rejection.outcome()) as i32,
                    reason: rejection.to_string(),
                    node_id: shared.identity.file.node_id.clone(),
                    ..Default::default()
                };
                // A well-formed command of ours that came too late is
                // journaled, so a replay gets the same answer; anything
                // that does not verify is answered and forgotten.
                if let (
                    command::Rejection::Expired { .. }
                    | command::Rejection::BelowMinGeneration { .. },
                    Some(p),
                    Some(k),
                ) = (&rejection, &payload, kind)
                {
                    shared
                        .journal
                        .accept(&d.command_id, d.seq, k.name(), &p.encode_to_vec())
                        .and_then(|()| {
                            shared
                                .journal
                                .finish(&d.command_id, &result.encode_to_vec())
                        })
                        .map_err(journal_err)?;
                }
                results::send_result(shared, conn, result).await;
            }
        }
        Ok(())
    }

    /// Starts an accepted command: raises the replay floor to its sequence
    /// (durable before anything happens; a floor that cannot be written
    /// fails the command instead), journals `running` with the boot id, then
    /// the side effect. A self-terminating command on a fake machine returns
    /// `Some(Stopped::Rebooted)`.
    pub(super) fn start(
        &mut self,
        shared: &mut Shared,
        update: &mut Option<Updater>,
        spec: Option<&v1::NodeSpec>,
        id: &str,
        kind: Option<Kind>,
        payload: &v1::CommandPayload,
    ) -> Result<Option<Stopped>, String> {
        let done = &self.done;
        let floors = ReplayFloors {
            command_seq: payload.seq,
            ..shared.identity.file.replay_floors
        };
        if let Err(e) = shared.identity.raise_floors(floors) {
            let reason = format!(
                "cannot persist the replay floor, so the command does not run: {}",
                bcd_sys::error::chain(&e)
            );
            warn!(cmd = %id, %reason);
            let _ = done.send(Box::new((id.to_string(), Effect::failed(reason))));
            return Ok(None);
        }
        let boot_id = shared
            .machine
            .host
            .boot_id()
            .map_err(|e| format!("boot id: {e}"))?;
        shared
            .journal
            .set_running(id, &boot_id)
            .map_err(|e| format!("journal: {e}"))?;
        shared.failpoints.at(Point::AfterRunning);
        shared.event(&CommandRunning {
            boot_id: boot_id.clone(),
            command_id: id.to_string(),
        });
        let id = id.to_string();
        info!(cmd = %id, kind = kind.map_or("unknown", Kind::name), "running");
        match (kind, payload.args.clone()) {
            (Some(Kind::ExecRun), Some(v1::command_payload::Args::Exec(args))) => {
                let done = done.clone();
                tokio::spawn(async move {
                    let effect = effects::exec(&args).await;
                    let _ = done.send(Box::new((id, effect)));
                });
            }
            (Some(Kind::InventoryRefresh), _) => {
                let _ = done.send(Box::new((id, Effect::ok())));
            }
            (Some(Kind::GpuReset), Some(v1::command_payload::Args::GpuReset(a))) => {
                let assignments = spec
                    .and_then(|s| s.devices.as_ref())
                    .map(|d| d.assignments.clone())
                    .unwrap_or_default();
                let resolved = shared
                    .machine
                    .host
                    .gpus()
                    .list()
                    .map_err(|e| format!("GPU inventory: {e}"))
                    .and_then(|gpus| resolve_for_reset(&gpus, &assignments, &a.gpu));
                match resolved {
                    Err(reason) => {
                        let _ = done.send(Box::new((id, Effect::failed(reason))));
                    }
                    Ok(pci) => {
                        let host = shared.machine.host.clone();
                        let done = done.clone();
                        tokio::task::spawn_blocking(move || {
                            let effect = match host.gpus().reset(&pci) {
                                Ok(how) => Effect {
                                    output: format!("{pci}: {how}\n").into_bytes(),
                                    ..Effect::ok()
                                },
                                Err(e) => Effect::failed(format!("reset {pci}: {e}")),
                            };
                            let _ = done.send(Box::new((id, effect)));
                        });
                    }
                }
            }
            (Some(Kind::NodeReboot), _) => {
                info!("rebooting");
                match shared.machine.power.reboot() {
                    Ok(()) => return Ok(Some(Stopped::Rebooted)),
                    Err(e) => {
                        let _ = done.send(Box::new((id, Effect::failed(format!("reboot: {e}")))));
                    }
                }
            }
            (Some(Kind::BootKexec), Some(v1::command_payload::Args::Kexec(k)))
                if !k.image_id.is_empty() =>
            {
                self.fetch_image(shared, id, k.image_id, k.cmdline);
            }
            (Some(Kind::BootKexec), Some(v1::command_payload::Args::Kexec(k))) => {
                info!(kernel = %k.kernel, "kexec");
                match shared.machine.power.kexec(&k.kernel, &k.initrd, &k.cmdline) {
                    Ok(()) => return Ok(Some(Stopped::Rebooted)),
                    Err(e) => {
                        let _ = done.send(Box::new((id, Effect::failed(format!("kexec: {e}")))));
                    }
                }
            }
            (Some(Kind::DaemonUpgrade), Some(v1::command_payload::Args::Upgrade(u))) => {
                update::stage_release(
                    update.as_ref(),
                    &shared.identity,
                    id,
                    u.sequence,
                    done,
                    &self.staged,
                );
            }
            (Some(Kind::DaemonRollback), _) => {
                let Some(update) = update.as_mut() else {
                    let _ = done.send(Box::new((
                        id,
                        Effect::failed("self-update is not available here"),
                    )));
                    return Ok(None);
                };
                let (output, restart) = update.abort().map_err(|e| format!("slots: {e}"))?;
                let effect = Effect {
                    output: output.into_bytes(),
                    ..Effect::ok()
                };
                if restart {
                    // The result is journaled before the switch takes
                    // effect; the old binary sends it.
                    results::journal_result(shared, &id, effect)?;
                    return Ok(Some(Stopped::Restart));
                }
                let _ = done.send(Box::new((id, effect)));
            }
            _ => {
                let _ = done.send(Box::new((
                    id,
                    Effect::failed("arguments do not match the kind"),
                )));
            }
        }
        Ok(None)
    }

    /// `boot.kexec image=`: fetches and verifies the image in the
    /// background (`client::fetch_image`); the loop loads it
    /// ([`load_image`]).
    fn fetch_image(&self, shared: &Shared, id: String, image_id: String, extra: String) {
        let staged = self.staged.clone();
        info!(cmd = %id, image = %image_id, "fetching the image to kexec");
        let identity = shared.identity.clone();
        let dir = self.kexec_dir.clone();
        tokio::spawn(async move {
            let result = crate::client::fetch_image(&identity, &image_id, &extra, &dir).await;
            let _ = staged.send(Box::new((id, result.map(Stage::Image))));
        });
    }

    /// On start: runs what was accepted and never started, finishes what
    /// was running (`rebooted` after a new boot, `interrupted` otherwise).
    pub(super) fn recover(
        &mut self,
        shared: &mut Shared,
        update: &mut Option<Updater>,
        spec: Option<&v1::NodeSpec>,
    ) -> Result<Option<Stopped>, String> {
        let boot_id = shared
            .machine
            .host
            .boot_id()
            .map_err(|e| format!("boot id: {e}"))?;
        let entries = shared
            .journal
            .open_entries()
            .map_err(|e| format!("journal: {e}"))?;
        for e in entries {
            match command::recover(Kind::parse(&e.kind), &e.state, &boot_id) {
                Recovery::Run => {
                    let Ok(payload) = v1::CommandPayload::decode(e.payload.as_slice()) else {
                        let _ = self.done.send(Box::new((
                            e.id,
                            Effect::failed("journaled payload does not decode"),
                        )));
                        continue;
                    };
                    info!(cmd = %e.id, "recovery: running a command accepted before the restart");
                    if let Some(stopped) =
                        self.start(shared, update, spec, &e.id, Kind::parse(&e.kind), &payload)?
                    {
                        return Ok(Some(stopped));
                    }
                }
                Recovery::Finish(outcome, reason) => {
                    info!(cmd = %e.id, outcome = outcome.name(), reason, "recovery: settling a command");
                    results::journal_result(
                        shared,
                        &e.id,
                        Effect {
                            outcome,
                            reason: reason.to_string(),
                            ..Effect::ok()
                        },
                    )?;
                }
                Recovery::Upgrade => {
                    // The update state settled it at start, or settles it
                    // at the first Welcome; with no record there, the
                    // process stopped before the switch.
                    let pending = update
                        .as_ref()
                        .and_then(|u| u.pending_command())
                        .is_some_and(|p| p == e.id);
                    if !pending {
                        info!(cmd = %e.id, "recovery: an upgrade stopped before the switch");
                        results::journal_result(
                            shared,
                            &e.id,
                            Effect::failed(command::reason::INTERRUPTED),
                        )?;
                    }
                }
                Recovery::Resend | Recovery::Nothing => {}
            }
        }
        Ok(None)
    }
}

/// A verified image is in hand: kexec it (on a fake machine the agent
/// then starts again), or say why not.
pub(super) fn load_image(
    shared: &Shared,
    id: &str,
    image: crate::client::KexecImage,
) -> Result<(), String> {
    info!(cmd = %id, image = %image.image_id, name = %image.name, cmdline = %image.cmdline, "kexec of a verified image");
    let (kernel, initrd) = (image.kernel.display(), image.initrd.display());
    shared
        .machine
        .power
        .kexec(&kernel.to_string(), &initrd.to_string(), &image.cmdline)
        .map_err(|e| {
            let _ = std::fs::remove_dir_all(image.kernel.parent().unwrap_or(&image.kernel));
            format!("kexec of image {}: {e}", image.image_id)
        })
}

/// What a command staged in the background is ready (or failed): a
/// release is switched to (the caller restarts), an image is loaded (the
/// machine is replaced); or why not.
pub(super) fn finish_staged(
    shared: &mut Shared,
    update: &mut Option<Updater>,
    id: &str,
    staged: Result<Stage, String>,
) -> Result<Stopped, String> {
    match staged? {
        Stage::Release(manifest) => {
            update::switch_release(update, &mut shared.failpoints, id, &manifest)?;
            Ok(Stopped::Restart)
        }
        Stage::Image(image) => {
            load_image(shared, id, image)?;
            Ok(Stopped::Rebooted)
        }
    }
}

/// The PCI address of the GPU `gpu` names (UUID, index or address), unless
/// an assignment holds it (a workload uses it).
pub(super) fn resolve_for_reset(
    gpus: &[Gpu],
    assignments: &[v1::GpuAssignment],
    gpu: &str,
) -> Result<String, String> {
    let g = gpus
        .iter()
        .find(|g| {
            g.pci_address == gpu
                || g.uuid.as_deref() == Some(gpu)
                || g.minor.is_some_and(|m| m.to_string() == gpu)
        })
        .ok_or_else(|| format!("GPU {gpu} is not on this node"))?;
    let names: Vec<String> = [g.uuid.clone(), g.minor.map(|m| m.to_string())]
        .into_iter()
        .flatten()
        .collect();
    if let Some(a) = assignments.iter().find(|a| {
        a.gpus
            .iter()
            .any(|r| names.contains(r) || *r == g.pci_address)
    }) {
        return Err(format!(
            "GPU {gpu} is assigned to allocation {} and in use: unassign it first",
            a.allocation_id
        ));
    }
    Ok(g.pci_address.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(pci: &str, uuid: &str, minor: u32) -> Gpu {
        Gpu {
            pci_address: pci.into(),
            vendor_id: "0x10de".into(),
            device_id: "0x2330".into(),
            class: "0x030200".into(),
            numa_node: None,
            uuid: Some(uuid.into()),
            model: None,
            minor: Some(minor),
        }
    }

    #[test]
    fn a_gpu_is_reset_by_any_name_unless_an_allocation_holds_it() {
        let gpus = [
            gpu("0000:17:00.0", "GPU-a", 0),
            gpu("0000:27:00.0", "GPU-b", 1),
        ];
        let held = [v1::GpuAssignment {
            allocation_id: "job-1".into(),
            gpus: vec!["1".into()],
            env: Default::default(),
            secrets: vec![],
        }];
        for name in ["0000:17:00.0", "GPU-a", "0"] {
            assert_eq!(
                resolve_for_reset(&gpus, &held, name).unwrap(),
                "0000:17:00.0"
            );
        }
        for name in ["0000:27:00.0", "GPU-b", "1"] {
            let e = resolve_for_reset(&gpus, &held, name).unwrap_err();
            assert!(
                e.contains("allocation job-1") && e.contains("unassign it first"),
                "{e}"
            );
        }
        assert_eq!(
            resolve_for_reset(&gpus, &[], "GPU-z").unwrap_err(),
            "GPU GPU-z is not on this node"
        );
    }
}
