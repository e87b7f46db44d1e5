//! Components built in this process from the SDK's traits, without a plugin library: for tests
//! and the core's simulator, which drive the manager with their own tuner, assessor and training
//! service through exactly the adaptors `export_plugin!` puts around a plugin's (every call
//! crosses the same JSON and error conversions).
//!
//! Their calls run inline on the caller's thread, not on a thread of their own: when a call's
//! [`Reply`](super::Reply) is awaited it has already finished, so a caller on tokio's paused
//! clock knows that no component is still working when it lets time move.

use abi_stable::sabi_trait::TD_Opaque;

use super::objects::{AssessorRaw, PluginThread, ServiceRaw};
use super::{
    AssessorHandle, AssessorObject, EventCallback, EventForwarder, HostError,
    TrainingServiceHandle, TrainingServiceObject, TunerHandle, TunerObject,
};
use crate::abi::EventSinkAbi_TO;
use crate::service::ServiceEvent;
use crate::{
    Assessor, AssessorContext, ComponentKind, EventSink, PluginError, TrainingService, Tuner,
};

/// A tuner handle over `tuner`, labelled `tuner <name>` in errors.
pub fn tuner<T: Tuner>(name: &str, tuner: T) -> TunerHandle {
    let object = TunerObject {
        raw: crate::sdk::in_process_tuner(tuner, name),
        label: format!("tuner {name}"),
        takes_objectives: T::takes_objectives(),
        wakes: false,
    };
    TunerHandle(
        PluginThread::inline(object.label.clone(), object),
        T::takes_objectives(),
        false,
    )
}

/// An assessor handle over `assessor`, told the experiment's context, labelled
/// `assessor <name>` in errors.
pub fn assessor<A: Assessor>(
    name: &str,
    assessor: A,
    context: &AssessorContext,
) -> Result<AssessorHandle, HostError> {
    let raw = crate::sdk::in_process_assessor(assessor, name, context).map_err(|e| {
        HostError::Constructor {
            kind: ComponentKind::Assessor,
            name: name.to_string(),
            message: e.message().to_string(),
        }
    })?;
    let object = AssessorObject {
        raw: AssessorRaw::InContext(raw),
        label: format!("assessor {name}"),
    };
    Ok(AssessorHandle(PluginThread::inline(
        object.label.clone(),
        object,
    )))
}

/// A training service built by `build` from the sink its events go to; they reach `on_event`
/// as a plugin's do (as JSON through the sink, from whichever thread emits them).
pub fn training_service<S: TrainingService>(
    name: &str,
    on_event: impl Fn(Result<ServiceEvent, String>) + Send + Sync + 'static,
    build: impl FnOnce(EventSink) -> Result<S, PluginError>,
) -> Result<TrainingServiceHandle, HostError> {
    let callback: EventCallback = Box::new(on_event);
    let sink = EventSinkAbi_TO::from_value(EventForwarder(callback), TD_Opaque);
    let raw = crate::sdk::in_process_training_service(name, sink, build).map_err(|e| {
        HostError::Constructor {
            kind: ComponentKind::TrainingService,
            name: name.to_string(),
            message: e.message().to_string(),
        }
    })?;
    let label = format!("training service {name}");
    let object = TrainingServiceObject {
        raw: ServiceRaw::WithRequests(raw),
        label: label.clone(),
    };
    Ok(TrainingServiceHandle(PluginThread::inline(label, object)))
}
