//! Where the manager gets its tuner, assessor and training services.
//!
//! A real experiment takes them from the plugin libraries ([`PluginRegistry`]); the simulator
//! (`crate::sim`) builds its own in this process (`knob_plugin_api::host::in_process`), behind
//! the same handles and the same ABI adaptors, so the manager cannot tell them apart.

use knob_plugin_api::host::{
    AssessorHandle, AssessorObject, HostError, PluginRegistry, TrainingServiceHandle, TunerHandle,
    TunerObject, WakeCallback,
};
use knob_plugin_api::service::{ServiceContext, ServiceEvent};
use knob_plugin_api::{AssessorContext, ComponentKind};
use serde_json::Value;

use crate::nni_dispatch;

/// Where a service's events go: called from whichever thread the service reports on.
pub type EventCallback = Box<dyn Fn(Result<ServiceEvent, String>) + Send + Sync>;

/// The components of an experiment, by the names its config gives.
pub trait Components {
    /// Whether a component of this kind and name can be built.
    fn provides(&self, kind: ComponentKind, name: &str) -> bool;
    fn tuner(&self, name: &str, class_args: &Value) -> Result<TunerHandle, HostError>;
    fn assessor(
        &self,
        name: &str,
        class_args: &Value,
        context: &AssessorContext,
    ) -> Result<AssessorHandle, HostError>;
    /// [`Components::tuner`] with a waker: `on_wake` runs when the tuner has parameters ready
    /// outside a call (`Tuner::set_waker`). Components that cannot wake build it without.
    fn tuner_waking(
        &self,
        name: &str,
        class_args: &Value,
        on_wake: WakeCallback,
    ) -> Result<TunerHandle, HostError> {
        let _ = on_wake;
        self.tuner(name, class_args)
    }
    /// [`Components::assessor`] with a waker: `on_wake` runs when the assessor has decided about
    /// a trial outside a call (`Assessor::set_waker`).
    fn assessor_waking(
        &self,
        name: &str,
        class_args: &Value,
        context: &AssessorContext,
        on_wake: WakeCallback,
    ) -> Result<AssessorHandle, HostError> {
        let _ = on_wake;
        self.assessor(name, class_args, context)
    }
    /// Builds the training service `platform` from its config (secrets in clear) and the
    /// experiment's context; its events go to `on_event`.
    fn training_service(
        &self,
        platform: &str,
        config: &Value,
        context: &ServiceContext,
        on_event: EventCallback,
    ) -> Result<TrainingServiceHandle, HostError>;
    /// On resume: has the service `platform` end what an earlier run left of these trials.
    fn clean_up_leftovers(
        &self,
        platform: &str,
        config: &Value,
        context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, HostError>;
}

impl Components for PluginRegistry {
    fn provides(&self, kind: ComponentKind, name: &str) -> bool {
        self.find(kind, name).is_ok()
    }

    fn tuner(&self, name: &str, class_args: &Value) -> Result<TunerHandle, HostError> {
        let tuner = self.tuner_object(name, class_args)?;
        Ok(tuner_named(tuner, name, class_args))
    }

    fn assessor(
        &self,
        name: &str,
        class_args: &Value,
        context: &AssessorContext,
    ) -> Result<AssessorHandle, HostError> {
        let assessor = self.assessor_object(name, class_args, context)?;
        Ok(assessor_named(assessor, name, class_args))
    }

    fn tuner_waking(
        &self,
        name: &str,
        class_args: &Value,
        on_wake: WakeCallback,
    ) -> Result<TunerHandle, HostError> {
        let tuner = self.tuner_object_waking(name, class_args, on_wake)?;
        Ok(tuner_named(tuner, name, class_args))
    }

    fn assessor_waking(
        &self,
        name: &str,
        class_args: &Value,
        context: &AssessorContext,
        on_wake: WakeCallback,
    ) -> Result<AssessorHandle, HostError> {
        let assessor = self.assessor_object_waking(name, class_args, context, on_wake)?;
        Ok(assessor_named(assessor, name, class_args))
    }

    fn training_service(
        &self,
        platform: &str,
        config: &Value,
        context: &ServiceContext,
        on_event: EventCallback,
    ) -> Result<TrainingServiceHandle, HostError> {
        self.create_training_service(platform, config, context, on_event)
    }

    fn clean_up_leftovers(
        &self,
        platform: &str,
        config: &Value,
        context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, HostError> {
        self.clean_up_training_service(platform, config, context, trial_ids)
    }
}

/// The tuner on its own thread, named by the NNI algorithm it runs when it is the dispatcher
/// plugin's (see [`nni_dispatch::label`]).
fn tuner_named(mut tuner: TunerObject, name: &str, class_args: &Value) -> TunerHandle {
    if let Some(label) = nni_dispatch::label(ComponentKind::Tuner, name, class_args) {
        tuner.relabel(label);
    }
    TunerHandle::new(tuner)
}

/// [`tuner_named`] for an assessor.
fn assessor_named(mut assessor: AssessorObject, name: &str, class_args: &Value) -> AssessorHandle {
    if let Some(label) = nni_dispatch::label(ComponentKind::Assessor, name, class_args) {
        assessor.relabel(label);
    }
    AssessorHandle::new(assessor)
}
