//! Machines enrolled by their TPM's EK (`EnrollMachine`, `ListMachines`,
//! `RemoveMachine`): they join with no token (`bc_store::machines`).

use bc_store::machines::{Enrolment, EnrolmentKind, NewEnrolment};
use bcd_proto::v1::{
    self, EnrollMachineRequest, EnrollMachineResponse, ListMachinesResponse, MachineInfo,
    RemoveMachineRequest,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::attest;
use super::status::{bad_request, refusal, status, unavailable};

/// The largest certificate taken.
const MAX_CERT: usize = 16 << 10;

/// An enrolment's kind as the wire names it.
fn wire_kind(k: EnrolmentKind) -> v1::MachineKind {
    match k {
        EnrolmentKind::Ek => v1::MachineKind::Ek,
        EnrolmentKind::EkCa => v1::MachineKind::EkCa,
    }
}

fn info(e: Enrolment) -> MachineInfo {
    let intermediates = attest::certificates(e.ca_intermediates.as_deref().unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .map(|der| attest::certificate_subject(der).unwrap_or_default())
        .collect();
    MachineInfo {
        intermediates,
        id: e.id,
        kind: wire_kind(e.kind) as i32,
        ek_sha256: e.ek_sha256.unwrap_or_default(),
        subject: e.subject,
        description: e.description,
        created_at_ms: e.created_ms,
        node_id: e.node_id.unwrap_or_default().into_string(),
    }
}

/// What the request enrols: exactly one of an EK hash, an EK certificate
/// and an EK CA certificate.
fn enrolment(r: &EnrollMachineRequest) -> Result<NewEnrolment, Status> {
    let given = [
        !r.ek_sha256.is_empty(),
        !r.ek_certificate_der.is_empty(),
        !r.ek_ca_der.is_empty(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(bad_request(
            "enrol one machine by its EK SHA-256, its EK certificate, or an EK CA: give exactly \
             one (--ek-sha256 HEX, --ek-cert FILE or --ek-ca FILE)",
        ));
    }
    if r.ek_certificate_der.len() > MAX_CERT
        || r.ek_ca_der.len() > MAX_CERT
        || r.ek_intermediates_der.iter().any(|c| c.len() > MAX_CERT)
    {
        return Err(bad_request(format!(
            "the certificate is over {MAX_CERT} bytes"
        )));
    }
    if !r.ek_intermediates_der.is_empty() && r.ek_ca_der.is_empty() {
        return Err(bad_request(
            "intermediates come with the EK CA they lead to: give --ek-ca FILE with \
             --ek-intermediates FILE",
        ));
    }
    if r.ek_intermediates_der.len() > attest::MAX_INTERMEDIATES {
        return Err(bad_request(format!(
            "{} intermediates: an EK certificate is admitted through at most {}; enrol the \
             intermediate nearest the EK certificates as the EK CA instead",
            r.ek_intermediates_der.len(),
            attest::MAX_INTERMEDIATES
        )));
    }
    if !r.ek_sha256.is_empty() {
        return NewEnrolment::ek(&r.ek_sha256, "", &r.description).map_err(refusal);
    }
    if !r.ek_certificate_der.is_empty() {
        let ek = attest::ek_from_certificate(&r.ek_certificate_der)
            .map_err(|e| bad_request(e.to_string()))?;
        let subject = attest::certificate_subject(&r.ek_certificate_der)
            .map_err(|e| bad_request(e.to_string()))?;
        return NewEnrolment::ek(&attest::ek_hash(&ek), &subject, &r.description).map_err(refusal);
    }
    let subject =
        attest::certificate_subject(&r.ek_ca_der).map_err(|e| bad_request(e.to_string()))?;
    let mut intermediates = Vec::new();
    for (n, der) in r.ek_intermediates_der.iter().enumerate() {
        // One certificate each, whole.
        match attest::certificates(der) {
            Ok(one) if one.len() == 1 => intermediates.extend_from_slice(der),
            Ok(_) => {
                return Err(bad_request(format!(
                    "intermediate {} is not one certificate (DER)",
                    n + 1
                )));
            }
            Err(e) => return Err(bad_request(format!("intermediate {}: {e}", n + 1))),
        }
    }
    Ok(NewEnrolment::ek_ca(
        r.ek_ca_der.clone(),
        intermediates,
        &subject,
        &r.description,
    ))
}

pub async fn enrol(
    svc: &AdminService,
    r: EnrollMachineRequest,
) -> Result<EnrollMachineResponse, Status> {
    let new = enrolment(&r)?;
    let e = svc.store.enrol_machine(&new).await.map_err(status)?;
    info!(enrolment = %e.id, subject = %e.subject, "machine enrolled");
    Ok(EnrollMachineResponse {
        machine: Some(info(e)),
        ca_pin: svc.ca_pin.clone(),
    })
}

pub async fn list(svc: &AdminService) -> Result<ListMachinesResponse, Status> {
    let machines = svc.store.list_enrolments().await.map_err(unavailable)?;
    Ok(ListMachinesResponse {
        machines: machines.into_iter().map(info).collect(),
    })
}

pub async fn remove(svc: &AdminService, r: RemoveMachineRequest) -> Result<MachineInfo, Status> {
    let e = svc.store.remove_enrolment(&r.id).await.map_err(status)?;
    info!(enrolment = %e.id, "machine enrolment removed");
    Ok(info(e))
}

#[cfg(test)]
mod tests {
    use bcd_proto::typed::Spelling;

    use super::*;

    /// Each kind goes on the wire spelled as the store keeps it.
    #[test]
    fn kinds_are_spelled_as_the_store_keeps_them() {
        for k in [EnrolmentKind::Ek, EnrolmentKind::EkCa] {
            assert_eq!(wire_kind(k).spelling(), k.as_str());
            assert_eq!(EnrolmentKind::parse(wire_kind(k).spelling()), Some(k));
        }
    }
}
