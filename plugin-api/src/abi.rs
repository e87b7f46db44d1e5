//! The binary interface between the knob host and a plugin library.
//!
//! Everything here is `#[repr(C)]` + `StableAbi` and is checked by abi_stable when a library is
//! loaded. Nothing in this module is visible to plugin authors or to the rest of knob: the SDK
//! (`crate::sdk`) adapts safe Rust traits to these types inside a plugin, and the host loader
//! (`crate::host`) adapts them back to safe Rust handles.
//!
//! Evolution rules:
//! - payloads that will grow (class args, search spaces, parameters, events) cross as JSON text;
//! - the ABI has a version of its own, [`ABI_VERSION`], separate from the crate's: a release of
//!   knob-plugin-api that leaves the binary interface alone keeps it, so plugins built against
//!   any earlier release with the same ABI keep loading. Appending fields to the root module
//!   raises its minor (plugins built for an older minor load, and get the old behaviour for what
//!   they lack); any other change raises its major (older plugins are refused, with "rebuild").
//! - the root module and the trait vtables are prefix types: a newer minor version of the ABI
//!   appends fields/methods after the last prefix field, and an older host simply does not see
//!   them. That is why a host accepts plugins built for the same or a newer minor.
//! - a library built before a field was appended to the root module lacks it: each appended
//!   field is `missing_field(option)` and the host falls back to what plugins did before it
//!   existed. New training-service calls are root-module functions taking the service's name
//!   and JSON, never new methods of `TrainingServiceAbi`, whose vtable stays as first released
//!   (an absent `#[sabi_trait]` method can only be found out by calling it).

// abi_stable 0.11's `#[sabi_trait]` expands to impls inside a const block, which newer rustc lints.
#![allow(non_local_definitions)]

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, RResult, RSlice, RStr, RString, RVec},
    StableAbi,
};

/// What a component is.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AbiComponentKind {
    Tuner,
    Assessor,
    TrainingService,
}

/// One entry of a plugin library's component list.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct AbiComponentInfo {
    pub kind: AbiComponentKind,
    pub name: RString,
    pub version: RString,
    pub description: RString,
}

/// The answer to "generate parameters for this parameter id".
#[repr(u8)]
#[derive(StableAbi, Debug, Clone)]
pub enum AbiGenerated {
    /// A JSON object of parameters.
    Parameters(RString),
    /// The tuner has nothing more to try (e.g. a finished grid).
    NoMore,
    /// Not now: the tuner will hand parameters for this id out later, through
    /// `take_suggestions` (NNI's Evolution does this while its population is incomplete).
    Deferred,
}

/// Parameters a tuner produced without being asked at that moment.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct AbiSuggestion {
    pub parameter_id: u64,
    pub parameters: RString,
}

/// A tuner built with a waker (ABI 1.4), and whether it will use it.
#[repr(C)]
#[derive(StableAbi)]
pub struct AbiWakingTuner {
    pub tuner: TunerBox,
    /// Whether the tuner may answer a deferred id later on its own (and wake the host): the
    /// host then waits for it even when no trial runs.
    pub wakes: bool,
}

/// An assessor's answer for one trial.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct AbiVerdict {
    pub keep_going: bool,
    pub reason: RString,
}

/// Severity of a message a plugin logs through the host.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AbiLogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// Failure of a call: a one-line message for the user.
pub type AbiResult<T> = RResult<T, RString>;

#[sabi_trait]
pub trait TunerAbi: Send {
    fn update_search_space(&mut self, search_space_json: RStr<'_>) -> AbiResult<()>;
    fn generate_parameters(&mut self, parameter_id: u64) -> AbiResult<AbiGenerated>;
    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters_json: RStr<'_>,
        value: f64,
    ) -> AbiResult<()>;
    fn trial_end(&mut self, parameter_id: u64, status: RStr<'_>) -> AbiResult<()>;
    fn import_data(&mut self, trials_json: RStr<'_>) -> AbiResult<()>;
    #[sabi(last_prefix_field)]
    fn take_suggestions(&mut self) -> AbiResult<RVec<AbiSuggestion>>;
}

#[sabi_trait]
pub trait AssessorAbi: Send {
    fn assess_trial(
        &mut self,
        trial_id: RStr<'_>,
        history: RSlice<'_, f64>,
    ) -> AbiResult<AbiVerdict>;
    #[sabi(last_prefix_field)]
    fn trial_end(&mut self, trial_id: RStr<'_>, status: RStr<'_>) -> AbiResult<()>;
}

/// An assessor built with the experiment's context (ABI 1.2): `AssessorAbi`'s calls and each
/// trial's final result. A new trait rather than methods appended to `AssessorAbi`: abi_stable
/// refuses a vtable shorter than the host's, so a host cannot call an appended method of an
/// older plugin's object; an older plugin lacks `new_assessor_in_context` instead, which the host
/// can see.
#[sabi_trait]
pub trait AssessorInContextAbi: Send {
    fn assess_trial(
        &mut self,
        trial_id: RStr<'_>,
        history: RSlice<'_, f64>,
    ) -> AbiResult<AbiVerdict>;
    fn trial_end(&mut self, trial_id: RStr<'_>, status: RStr<'_>) -> AbiResult<()>;
    #[sabi(last_prefix_field)]
    fn trial_final(&mut self, trial_id: RStr<'_>, value: f64) -> AbiResult<()>;
}

/// Where a training service sends what happens to its environments and trials (JSON events).
/// Called from any of the plugin's threads.
#[sabi_trait]
pub trait EventSinkAbi: Send + Sync {
    #[sabi(last_prefix_field)]
    fn emit(&self, event_json: RStr<'_>);
}

#[sabi_trait]
pub trait TrainingServiceAbi: Send {
    fn environments(&mut self) -> AbiResult<RString>;
    fn start_trial(&mut self, request_json: RStr<'_>) -> AbiResult<()>;
    fn kill_trial(&mut self, trial_id: RStr<'_>, reason: RStr<'_>) -> AbiResult<()>;
    #[sabi(last_prefix_field)]
    fn shutdown(&mut self) -> AbiResult<()>;
}

/// A training service that also answers the host's requests (ABI 1.5): `TrainingServiceAbi`'s
/// calls and `request`, which takes a `service::ServiceRequest` as JSON and answers JSON. A new
/// trait rather than a method appended to `TrainingServiceAbi`, for the reason given at
/// `AssessorInContextAbi`; an older plugin lacks `create_training_service_with_requests`, which
/// the host can see. Later requests are new `ServiceRequest` kinds, not new methods.
#[sabi_trait]
pub trait TrainingServiceWithRequestsAbi: Send {
    fn environments(&mut self) -> AbiResult<RString>;
    fn start_trial(&mut self, request_json: RStr<'_>) -> AbiResult<()>;
    fn kill_trial(&mut self, trial_id: RStr<'_>, reason: RStr<'_>) -> AbiResult<()>;
    fn shutdown(&mut self) -> AbiResult<()>;
    #[sabi(last_prefix_field)]
    fn request(&mut self, request_json: RStr<'_>) -> AbiResult<RString>;
}

/// The host's logger, handed to each library once after loading.
#[sabi_trait]
pub trait HostLoggerAbi: Send + Sync {
    #[sabi(last_prefix_field)]
    fn log(&self, level: AbiLogLevel, target: RStr<'_>, message: RStr<'_>);
}

pub type TunerBox = TunerAbi_TO<'static, RBox<()>>;
pub type AssessorBox = AssessorAbi_TO<'static, RBox<()>>;
pub type AssessorInContextBox = AssessorInContextAbi_TO<'static, RBox<()>>;
pub type EventSinkBox = EventSinkAbi_TO<'static, RBox<()>>;
pub type TrainingServiceBox = TrainingServiceAbi_TO<'static, RBox<()>>;
pub type HostLoggerBox = HostLoggerAbi_TO<'static, RBox<()>>;
pub type TrainingServiceWithRequestsBox = TrainingServiceWithRequestsAbi_TO<'static, RBox<()>>;

/// The root module every knob plugin library exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(panic))]
pub struct PluginModule {
    pub components: extern "C" fn() -> RVec<AbiComponentInfo>,
    pub set_host_logger: extern "C" fn(HostLoggerBox),
    pub new_tuner: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<TunerBox>,
    pub new_assessor: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<AssessorBox>,
    #[sabi(last_prefix_field)]
    pub new_training_service:
        extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<TrainingServiceBox>,
    // ---- appended-fields: begin ----
    // Fields appended after the first 0.1 release. A library built before has none of them; the
    // host checks it against its own layout (`earlier_layouts`), the accessors answer `None`, and
    // the host supplies the old behaviour (see `host::PluginRegistry::check_training_service`).
    // Append new fields after the last one, each `missing_field(option)`, freeze the layout
    // before them in `earlier_layouts` under the ABI version that had it, raise the minor of
    // `ABI_VERSION` (and its history below), and never reorder, remove or retype one.
    /// Checks a service's config: (name, config JSON, `ServiceContext` JSON) to a
    /// `service::ConfigCheck` as JSON.
    #[sabi(missing_field(option))]
    pub check_training_service: extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
    /// Constructs a service with its context: (name, checked config JSON, context JSON, sink).
    #[sabi(missing_field(option))]
    pub create_training_service:
        extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<TrainingServiceBox>,
    /// Ends what an earlier run of the experiment left running: (name, config JSON, context
    /// JSON, JSON list of trial ids) to a JSON list of one-line reports.
    #[sabi(missing_field(option))]
    pub clean_up_training_service:
        extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
    /// Constructs an assessor with the experiment's context (ABI 1.2): (name, class args JSON,
    /// `AssessorContext` JSON).
    #[sabi(missing_field(option))]
    pub new_assessor_in_context:
        extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<AssessorInContextBox>,
    /// Whether the tuner of this name takes vector objectives: its `receive_trial_result` then
    /// gets, in an experiment with `objectives`, the parameters wrapped with the trial's
    /// `Outcome` (`crate::objectives::wrap`). A library without this field never does, and
    /// such a tuner keeps receiving a scalar.
    #[sabi(missing_field(option))]
    pub tuner_takes_objectives: extern "C" fn(RStr<'_>) -> bool,
    /// Constructs a tuner with a waker (ABI 1.4): (name, class args JSON, sink). The tuner
    /// emits on the sink, from any thread, when it has parameters ready that nobody asked for
    /// at that moment (a late answer to a deferred id); the host then calls `take_suggestions`.
    /// `wakes` in the answer says whether the tuner will ever do so.
    #[sabi(missing_field(option))]
    pub new_tuner_with_waker:
        extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<AbiWakingTuner>,
    /// Constructs an assessor with its context and a waker (ABI 1.4): (name, class args JSON,
    /// `AssessorContext` JSON, sink). The assessor emits on the sink when it has decided about
    /// a trial outside a call (a late kill); the host then asks it again about every running
    /// trial.
    #[sabi(missing_field(option))]
    pub new_assessor_with_waker: extern "C" fn(
        RStr<'_>,
        RStr<'_>,
        RStr<'_>,
        EventSinkBox,
    ) -> AbiResult<AssessorInContextBox>,
    /// Constructs a service that answers requests (ABI 1.5): (name, checked config JSON,
    /// context JSON, sink), as `create_training_service`. The host prefers it; a library
    /// without it builds its services with `create_training_service`, and the host then asks
    /// them nothing beyond `TrainingServiceAbi`.
    #[sabi(missing_field(option))]
    pub create_training_service_with_requests:
        extern "C" fn(
            RStr<'_>,
            RStr<'_>,
            RStr<'_>,
            EventSinkBox,
        ) -> AbiResult<TrainingServiceWithRequestsBox>,
    /// Whether the tuner of this name takes a final result as the trial reported it (ABI 1.6):
    /// its `receive_trial_result` then gets, where the metric could be read, the parameters
    /// wrapped with the whole metric (`crate::metric::wrap_whole`: a dict's every entry, not
    /// only its default number). NNI's tuners are handed what the trial reported, and a user's
    /// own class may read any entry. A library without this field never does.
    #[sabi(missing_field(option))]
    pub tuner_takes_whole_metrics: extern "C" fn(RStr<'_>) -> bool,
    // ---- appended-fields: end ----
}

/// The root module's earlier layouts, frozen, oldest first. abi_stable's check refuses a library
/// whose root module has fewer fields than the host's (it lets only newer libraries into older
/// hosts), so the host checks a library built before the latest appended fields against the
/// layout it was built with, and then reads the appended fields as absent. Appending fields
/// means adding the layout before them here.
pub mod earlier_layouts {
    use super::*;
    use abi_stable::type_layout::TypeLayout;

    /// The first 0.1 release: the five fields up to `new_training_service`.
    // Only its layout is used, never its accessors.
    #[allow(dead_code)]
    pub mod first_release {
        use super::*;

        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
        #[sabi(missing_field(panic))]
        pub struct PluginModule {
            pub components: extern "C" fn() -> RVec<AbiComponentInfo>,
            pub set_host_logger: extern "C" fn(HostLoggerBox),
            pub new_tuner: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<TunerBox>,
            pub new_assessor: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<AssessorBox>,
            #[sabi(last_prefix_field)]
            pub new_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<TrainingServiceBox>,
        }
    }

    /// ABI 1.1: the three training-service fields appended.
    // Only its layout is used, never its accessors.
    #[allow(dead_code)]
    pub mod abi_1_1 {
        use super::*;

        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
        #[sabi(missing_field(panic))]
        pub struct PluginModule {
            pub components: extern "C" fn() -> RVec<AbiComponentInfo>,
            pub set_host_logger: extern "C" fn(HostLoggerBox),
            pub new_tuner: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<TunerBox>,
            pub new_assessor: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<AssessorBox>,
            #[sabi(last_prefix_field)]
            pub new_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub check_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub create_training_service: extern "C" fn(
                RStr<'_>,
                RStr<'_>,
                RStr<'_>,
                EventSinkBox,
            )
                -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub clean_up_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
        }
    }

    /// ABI 1.2: `new_assessor_in_context` appended (before `tuner_takes_objectives`).
    #[allow(dead_code)]
    pub mod abi_1_2 {
        use super::*;

        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
        #[sabi(missing_field(panic))]
        pub struct PluginModule {
            pub components: extern "C" fn() -> RVec<AbiComponentInfo>,
            pub set_host_logger: extern "C" fn(HostLoggerBox),
            pub new_tuner: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<TunerBox>,
            pub new_assessor: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<AssessorBox>,
            #[sabi(last_prefix_field)]
            pub new_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub check_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub create_training_service: extern "C" fn(
                RStr<'_>,
                RStr<'_>,
                RStr<'_>,
                EventSinkBox,
            )
                -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub clean_up_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub new_assessor_in_context:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<AssessorInContextBox>,
        }
    }

    /// ABI 1.3: `tuner_takes_objectives` appended (before the waker constructors).
    #[allow(dead_code)]
    pub mod abi_1_3 {
        use super::*;

        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
        #[sabi(missing_field(panic))]
        pub struct PluginModule {
            pub components: extern "C" fn() -> RVec<AbiComponentInfo>,
            pub set_host_logger: extern "C" fn(HostLoggerBox),
            pub new_tuner: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<TunerBox>,
            pub new_assessor: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<AssessorBox>,
            #[sabi(last_prefix_field)]
            pub new_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub check_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub create_training_service: extern "C" fn(
                RStr<'_>,
                RStr<'_>,
                RStr<'_>,
                EventSinkBox,
            )
                -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub clean_up_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub new_assessor_in_context:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<AssessorInContextBox>,
            #[sabi(missing_field(option))]
            pub tuner_takes_objectives: extern "C" fn(RStr<'_>) -> bool,
        }
    }

    /// ABI 1.4: the waker constructors appended (before
    /// `create_training_service_with_requests`).
    #[allow(dead_code)]
    pub mod abi_1_4 {
        use super::*;

        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
        #[sabi(missing_field(panic))]
        pub struct PluginModule {
            pub components: extern "C" fn() -> RVec<AbiComponentInfo>,
            pub set_host_logger: extern "C" fn(HostLoggerBox),
            pub new_tuner: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<TunerBox>,
            pub new_assessor: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<AssessorBox>,
            #[sabi(last_prefix_field)]
            pub new_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub check_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub create_training_service: extern "C" fn(
                RStr<'_>,
                RStr<'_>,
                RStr<'_>,
                EventSinkBox,
            )
                -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub clean_up_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub new_assessor_in_context:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<AssessorInContextBox>,
            #[sabi(missing_field(option))]
            pub tuner_takes_objectives: extern "C" fn(RStr<'_>) -> bool,
            #[sabi(missing_field(option))]
            pub new_tuner_with_waker:
                extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<AbiWakingTuner>,
            #[sabi(missing_field(option))]
            pub new_assessor_with_waker: extern "C" fn(
                RStr<'_>,
                RStr<'_>,
                RStr<'_>,
                EventSinkBox,
            )
                -> AbiResult<AssessorInContextBox>,
        }
    }

    /// ABI 1.5: `create_training_service_with_requests` appended (before
    /// `tuner_takes_whole_metrics`).
    // Only its layout is used, never its accessors.
    #[allow(dead_code)]
    pub mod abi_1_5 {
        use super::*;

        #[repr(C)]
        #[derive(StableAbi)]
        #[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
        #[sabi(missing_field(panic))]
        pub struct PluginModule {
            pub components: extern "C" fn() -> RVec<AbiComponentInfo>,
            pub set_host_logger: extern "C" fn(HostLoggerBox),
            pub new_tuner: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<TunerBox>,
            pub new_assessor: extern "C" fn(RStr<'_>, RStr<'_>) -> AbiResult<AssessorBox>,
            #[sabi(last_prefix_field)]
            pub new_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub check_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub create_training_service: extern "C" fn(
                RStr<'_>,
                RStr<'_>,
                RStr<'_>,
                EventSinkBox,
            )
                -> AbiResult<TrainingServiceBox>,
            #[sabi(missing_field(option))]
            pub clean_up_training_service:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<RString>,
            #[sabi(missing_field(option))]
            pub new_assessor_in_context:
                extern "C" fn(RStr<'_>, RStr<'_>, RStr<'_>) -> AbiResult<AssessorInContextBox>,
            #[sabi(missing_field(option))]
            pub tuner_takes_objectives: extern "C" fn(RStr<'_>) -> bool,
            #[sabi(missing_field(option))]
            pub new_tuner_with_waker:
                extern "C" fn(RStr<'_>, RStr<'_>, EventSinkBox) -> AbiResult<AbiWakingTuner>,
            #[sabi(missing_field(option))]
            pub new_assessor_with_waker: extern "C" fn(
                RStr<'_>,
                RStr<'_>,
                RStr<'_>,
                EventSinkBox,
            )
                -> AbiResult<AssessorInContextBox>,
            #[sabi(missing_field(option))]
            pub create_training_service_with_requests:
                extern "C" fn(
                    RStr<'_>,
                    RStr<'_>,
                    RStr<'_>,
                    EventSinkBox,
                ) -> AbiResult<TrainingServiceWithRequestsBox>,
        }
    }

    /// Newest first: the layouts a library may have been built with, besides the current one,
    /// each with the ABI version that had it.
    pub fn newest_first() -> [(&'static str, &'static TypeLayout); 6] {
        [
            ("1.5.0", <abi_1_5::PluginModuleRef as StableAbi>::LAYOUT),
            ("1.4.0", <abi_1_4::PluginModuleRef as StableAbi>::LAYOUT),
            ("1.3.0", <abi_1_3::PluginModuleRef as StableAbi>::LAYOUT),
            ("1.2.0", <abi_1_2::PluginModuleRef as StableAbi>::LAYOUT),
            ("1.1.0", <abi_1_1::PluginModuleRef as StableAbi>::LAYOUT),
            (
                "1.0.0",
                <first_release::PluginModuleRef as StableAbi>::LAYOUT,
            ),
        ]
    }
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "knob_plugin";
    const NAME: &'static str = "knob_plugin";
    // abi_stable's own version check (same major; for 0.x, a minor at least the host's) is
    // replaced by ours on `ABI_VERSION`, made before it: held at the first release's crate
    // version, which every plugin built so far declares, it never refuses a library ours takes.
    // (It used to be the crate version, which made every plugin-api release an ABI break.)
    const VERSION_STRINGS: VersionStrings = VersionStrings::new("0.1.0");
}

/// The ABI version as a literal, for `concat!`.
macro_rules! abi_version {
    () => {
        "1.6.0"
    };
}

/// The version of the binary interface between knob and its plugins (semver), separate from
/// knob-plugin-api's crate version and raised only when the interface changes: the minor when
/// fields are appended to the root module (a plugin built for an older minor still loads and
/// gets the old behaviour for what it lacks), the major for anything else. History:
/// - 1.0.0: the first release's root module (up to `new_training_service`);
/// - 1.1.0: `check_training_service`, `create_training_service`, `clean_up_training_service`;
/// - 1.2.0: `new_assessor_in_context` ([`AssessorInContextAbi`]: the experiment's optimize_mode
///   and the trials' final results reach assessors);
/// - 1.3.0: `tuner_takes_objectives` (vector objectives, issue 15);
/// - 1.4.0: `new_tuner_with_waker`, `new_assessor_with_waker` (a tuner's late suggestions and an
///   assessor's late kills wake the host at once, issue 14);
/// - 1.5.0: `create_training_service_with_requests` ([`TrainingServiceWithRequestsAbi`]: the host
///   asks a running service to delete a replaced PBT member's checkpoint folder, issue 15).
/// - 1.6.0: `tuner_takes_whole_metrics` (a tuner may take a final result as the trial reported
///   it, a dict's every entry: NNI's tuners through its dispatcher).
///
/// Plugins built before ABI versions existed export only [`API_VERSION_SYMBOL`] (0.1.x); the
/// host takes them as ABI 1.0.0 or 1.1.0, whichever layout their root module has.
pub const ABI_VERSION: &str = abi_version!();

/// A plain C symbol every knob plugin exports: the ABI version it was built for,
/// NUL-terminated. The host reads it before abi_stable checks anything, which lets it tell "not
/// a knob plugin" and "built for another ABI" apart from a layout mismatch.
pub const ABI_VERSION_SYMBOL: &str = "knob_plugin_abi_version";

/// [`ABI_VERSION`], NUL-terminated, as exported under [`ABI_VERSION_SYMBOL`].
pub const ABI_VERSION_NUL: &str = concat!(abi_version!(), "\0");

/// The symbol under which abi_stable looks for a library's root module. `export_plugin!` has to
/// spell it as a literal (an `#[export_name]` cannot take a path), so this checks the literal.
pub const ROOT_MODULE_SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";
const _: () = assert!(const_str_eq(
    ROOT_MODULE_SYMBOL,
    abi_stable::library::ROOT_MODULE_LOADER_NAME
));

/// A plain C symbol every knob plugin exports next to the abi_stable root module: the
/// knob-plugin-api crate version it was built against, NUL-terminated (shown by `knob plugin
/// list`; compatibility is judged by [`ABI_VERSION_SYMBOL`]).
pub const API_VERSION_SYMBOL: &str = "knob_plugin_api_version";

/// This crate's version, NUL-terminated, as exported under [`API_VERSION_SYMBOL`].
pub const API_VERSION_NUL: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
