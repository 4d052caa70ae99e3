//! Self-update glue: `daemon.upgrade` stages a release and switches slots;
//! at start the update state a previous process left is settled; the first
//! Welcome confirms a new release. The decisions are
//! `bcd_core::update`'s, the files [`Updater`](crate::upgrade::Updater)'s.

use bcd_core::command;
use tokio::sync::mpsc;
use tracing::info;

use super::results;
use super::{Done, Shared, Stage, Staged, Stopped};
use crate::effects::Effect;
use crate::failpoints::Failpoints;
use crate::failpoints::Point;
use crate::identity::Identity;
use crate::journal::Journal;
use crate::upgrade::{self, AtStart, Updater, UpgradeError};

/// `daemon.upgrade`: refuses at once what the update state refuses,
/// then downloads, verifies and writes the release to the inactive slot
/// in the background; the loop switches (`switch_release`).
pub(super) fn stage_release(
    update: Option<&Updater>,
    identity: &Identity,
    id: String,
    sequence: u64,
    done: &mpsc::UnboundedSender<Done>,
    staged: &mpsc::UnboundedSender<Staged>,
) {
    let Some(update) = update else {
        let _ = done.send(Box::new((
            id,
            Effect::failed("self-update is not available here"),
        )));
        return;
    };
    if let Err(refusal) = update.plan(sequence) {
        let _ = done.send(Box::new((id, Effect::failed(refusal.to_string()))));
        return;
    }
    let identity = identity.clone();
    let staged = staged.clone();
    let writer = Updater {
        slots: update.slots.clone(),
        acts: update.acts.clone(),
        state: update.state.clone(),
        confirm_within: update.confirm_within,
        supervised: false,
        deadline_ms: None,
        confirmation_asked: false,
    };
    tokio::spawn(async move {
        let result = match crate::client::fetch_release(&identity, sequence).await {
            Err(e) => Err(e),
            Ok((manifest, binary)) => tokio::task::spawn_blocking(move || {
                writer.write(manifest.sequence, &binary).map(|_| manifest)
            })
            .await
            .unwrap_or_else(|e| Err(format!("writing the slot: {e}"))),
        };
        let _ = staged.send(Box::new((id, result.map(Stage::Release))));
    });
}

/// A release is in the inactive slot: record the upgrade and switch
/// (the caller restarts), or say why not.
pub(super) fn switch_release(
    update: &mut Option<Updater>,
    failpoints: &mut Failpoints,
    id: &str,
    manifest: &release::Manifest,
) -> Result<(), String> {
    let update = update.as_mut().expect("staged only with an updater");
    update.switch(id, manifest, upgrade::boot_ms())?;
    failpoints.at(Point::AfterSwitch);
    Ok(())
}

/// At start: settles what the update state says about a previous
/// process's upgrade.
pub(super) fn settle(
    update: &mut Option<Updater>,
    shared: &mut Shared,
) -> Result<Option<Stopped>, String> {
    let Some(updater) = update.as_mut() else {
        return Ok(None);
    };
    let at_start = match updater.start(upgrade::boot_ms()) {
        Ok(a) => a,
        Err(e @ UpgradeError::BelowFloor { .. }) => {
            return Ok(Some(Stopped::BelowFloor(e.to_string())));
        }
        Err(e) => return Err(format!("update state: {e}")),
    };
    match at_start {
        AtStart::Run => {}
        AtStart::AwaitWelcome { deadline_ms } => {
            info!(
                in_ms = deadline_ms.saturating_sub(upgrade::boot_ms()),
                "running a new release; it confirms on the key holder's receipt of its \
                 report at the first Welcome"
            );
            if let Some(u) = update.as_mut() {
                u.deadline_ms = Some(deadline_ms);
            }
            // It may be swapped back: keep writing what the previous
            // release reads until then.
            shared.identity.write_version = 1;
        }
        AtStart::Restart => return Ok(Some(Stopped::Restart)),
        AtStart::Finished {
            command_id,
            succeeded,
            reason,
            output,
        } => {
            tracing::warn!(cmd = %command_id, reason, "the upgrade did not confirm; this is the previous release");
            let effect = Effect {
                outcome: if succeeded {
                    command::Outcome::Succeeded
                } else {
                    command::Outcome::Failed
                },
                reason: reason.to_string(),
                output: output.into_bytes(),
                ..Effect::ok()
            };
            results::journal_result_if_running(shared, &command_id, effect)?;
            update
                .as_ref()
                .expect("checked above")
                .settled()
                .map_err(|e| format!("update state: {e}"))?;
        }
    }
    Ok(None)
}

/// A session of a new release is up: it reports the upgrade it
/// awaits confirmation of, once a process, as a security event the node
/// keeps until the key holder's receipt ([`receipted`]).
pub(super) fn ask_confirmation(update: &mut Option<Updater>, journal: &Journal) {
    if update.as_ref().is_none_or(|u| u.confirmation_asked) {
        return;
    }
    let Some((body, _)) = update.as_ref().and_then(|u| u.awaiting()) else {
        return;
    };
    // Asked once a process, once journaled: a journal that could not
    // take it is asked again at the next session.
    match journal.push_event(
        bcd_core::update::CONFIRM_EVENT,
        crate::journal::EventClass::Transition,
        body.as_bytes(),
        crate::journal::EventBounds::default(),
    ) {
        Ok(true) => {
            if let Some(u) = update.as_mut() {
                u.confirmation_asked = true;
            }
            info!("the new release asks the key holder to confirm it");
        }
        Ok(false) => tracing::warn!("the journal has no room for the release's report"),
        Err(e) => tracing::warn!(error = %e, "cannot journal the release's report"),
    }
}

/// The key holder's receipt of an event of `kind` whose body has
/// SHA-256 `body_sha256`, checked against the journal: confirms the
/// upgrade when it is of the report this binary awaits: `Some` with the
/// upgrade's command, whose result is journaled, to send.
pub(super) fn receipted(
    update: &mut Option<Updater>,
    shared: &mut Shared,
    kind: &str,
    body_sha256: &str,
) -> Result<Option<String>, String> {
    let awaited = update.as_ref().and_then(|u| u.awaiting());
    match awaited {
        Some((_, digest)) if kind == bcd_core::update::CONFIRM_EVENT && digest == body_sha256 => {
            confirm(update, shared)
        }
        _ => Ok(None),
    }
}

/// The key holder confirmed a new release: journal SUCCEEDED, then raise
/// the floor on disk. `Some` with the upgrade's command.
fn confirm(update: &mut Option<Updater>, shared: &mut Shared) -> Result<Option<String>, String> {
    let Some(confirmed) = update.as_mut().and_then(|u| u.confirm()) else {
        return Ok(None);
    };
    let id = confirmed.command_id;
    if let Some(u) = update.as_mut() {
        u.deadline_ms = None;
    }
    info!(cmd = %id, "the new release is confirmed");
    // From now on the floor keeps older releases from running: write
    // this release's format (with the floors and the clock base).
    if shared.identity.write_version != crate::identity::IDENTITY_VERSION {
        shared.identity.write_version = crate::identity::IDENTITY_VERSION;
        shared
            .identity
            .save_state()
            .map_err(|e| format!("cannot rewrite identity.json: {e:#}"))?;
    }
    results::journal_result_if_running(
        shared,
        &id,
        Effect {
            output: confirmed.output.into_bytes(),
            ..Effect::ok()
        },
    )?;
    // A release signed with the current key rotated it: from now on
    // only the new key signs releases this node installs. Installed
    // before the update state is saved, so a crash here confirms (and
    // installs) again on the next process's confirmation.
    if let Some(key) = confirmed.next_key
        && shared.identity.file.release_keys != [key.clone()]
    {
        info!(key = %key, "rotating the release key");
        shared.identity.file.release_keys = vec![key];
        shared
            .identity
            .save_state()
            .map_err(|e| format!("cannot save the rotated release key: {e:#}"))?;
    }
    update
        .as_ref()
        .expect("confirmed through it")
        .settled()
        .map_err(|e| format!("update state: {e}"))?;
    Ok(Some(id))
}

/// The daemon's own watchdog: swaps an upgrade still unconfirmed at its
/// deadline back. True when it swapped (the caller restarts).
pub(super) fn overdue(update: &mut Option<Updater>) -> bool {
    if let Some(u) = update.as_mut() {
        u.deadline_ms = None;
    }
    match update.as_mut().map(|u| u.tick(upgrade::boot_ms())) {
        Some(Ok(swapped)) => swapped,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot swap back");
            false
        }
        None => false,
    }
}

/// Sleeps until a boot-clock deadline; forever without one.
pub(super) async fn upgrade_sleep(deadline_ms: Option<u64>) {
    match deadline_ms {
        Some(d) => {
            let wait = d.saturating_sub(upgrade::boot_ms());
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
        None => std::future::pending().await,
    }
}
