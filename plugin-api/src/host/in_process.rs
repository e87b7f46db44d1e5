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
    let object = tuner_object(name, tuner);
    TunerHandle {
        takes_objectives: T::takes_objectives(),
        wakes: false,
        takes_whole_metrics: T::takes_whole_metrics(),
        thread: PluginThread::inline(object.label.clone(), object),
    }
}

/// [`tuner`] on a thread of its own, as a plugin's tuner runs: a call that takes long (a model
/// being fitted) keeps only the tuner busy. For tests of what the host does meanwhile.
pub fn tuner_on_thread<T: Tuner>(name: &str, tuner: T) -> TunerHandle {
    TunerHandle::new(tuner_object(name, tuner))
}

fn tuner_object<T: Tuner>(name: &str, tuner: T) -> TunerObject {
    TunerObject {
        raw: crate::sdk::in_process_tuner(tuner, name),
        label: format!("tuner {name}"),
        takes_objectives: T::takes_objectives(),
        wakes: false,
        takes_whole_metrics: T::takes_whole_metrics(),
    }
}

/// An assessor handle over `assessor`, told the experiment's context, labelled
/// `assessor <name>` in errors.
pub fn assessor<A: Assessor>(
    name: &str,
    assessor: A,
    context: &AssessorContext,
) -> Result<AssessorHandle, HostError> {
    let raw = crate::sdk::in_process_assessor(assessor, name, context)
        .map_err(|e| super::constructor_error(ComponentKind::Assessor, name, e.message()))?;
    let object = AssessorObject {
        raw: AssessorRaw::InContext(raw),
        label: format!("assessor {name}"),
    };
    Ok(AssessorHandle(PluginThread::inline(
        object.label.clone(),
        object,
    )))
}

/// [`assessor`] on a thread of its own, as a plugin's assessor runs: a call that takes long (or
/// never returns) keeps only the assessor busy. For tests of what the host does meanwhile.
pub fn assessor_on_thread<A: Assessor>(
    name: &str,
    assessor: A,
    context: &AssessorContext,
) -> Result<AssessorHandle, HostError> {
    let raw = crate::sdk::in_process_assessor(assessor, name, context)
        .map_err(|e| super::constructor_error(ComponentKind::Assessor, name, e.message()))?;
    Ok(AssessorHandle::new(AssessorObject {
        raw: AssessorRaw::InContext(raw),
        label: format!("assessor {name}"),
    }))
}

/// A training service built by `build` from the sink its events go to; they reach `on_event`
/// as a plugin's do (as JSON through the sink, from whichever thread emits them).
pub fn training_service<S: TrainingService>(
    name: &str,
    on_event: impl Fn(Result<ServiceEvent, String>) + Send + Sync + 'static,
    build: impl FnOnce(EventSink) -> Result<S, PluginError>,
) -> Result<TrainingServiceHandle, HostError> {
    let (label, object) = service_object(name, on_event, build)?;
    Ok(TrainingServiceHandle::new(PluginThread::inline(
        label, object,
    )))
}

/// [`training_service`] on a thread of its own, as a plugin's service runs: its calls are
/// answered in order there, so one that takes long (a start that waits on a host) keeps only
/// this service busy. For tests of what the host does meanwhile.
pub fn training_service_on_thread<S: TrainingService>(
    name: &str,
    on_event: impl Fn(Result<ServiceEvent, String>) + Send + Sync + 'static,
    build: impl FnOnce(EventSink) -> Result<S, PluginError>,
) -> Result<TrainingServiceHandle, HostError> {
    let (label, object) = service_object(name, on_event, build)?;
    Ok(TrainingServiceHandle::new(PluginThread::spawn(
        label, object,
    )))
}

fn service_object<S: TrainingService>(
    name: &str,
    on_event: impl Fn(Result<ServiceEvent, String>) + Send + Sync + 'static,
    build: impl FnOnce(EventSink) -> Result<S, PluginError>,
) -> Result<(String, TrainingServiceObject), HostError> {
    let callback: EventCallback = Box::new(on_event);
    let sink = EventSinkAbi_TO::from_value(EventForwarder::new(name, callback), TD_Opaque);
    let raw = crate::sdk::in_process_training_service(name, sink, build)
        .map_err(|e| super::constructor_error(ComponentKind::TrainingService, name, e.message()))?;
    let label = format!("training service {name}");
    let object = TrainingServiceObject::new(ServiceRaw::WithRequests(raw), label.clone());
    Ok((label, object))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::{json, Value};

    use super::*;
    use crate::host::EnvironmentReport;
    use crate::service::{Environment, TrialRequest};

    /// A service whose environments the test sets, with the SDK's comparison (no
    /// `environment_changes` of its own).
    struct Boxes {
        environments: Arc<Mutex<Vec<Environment>>>,
    }

    impl TrainingService for Boxes {
        fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
            Ok(self.environments.lock().unwrap().clone())
        }
        fn start_trial(&mut self, _request: TrialRequest) -> Result<(), PluginError> {
            Ok(())
        }
        fn kill_trial(&mut self, _trial_id: &str, _reason: &str) -> Result<(), PluginError> {
            Ok(())
        }
        fn shutdown(&mut self) -> Result<(), PluginError> {
            Ok(())
        }
    }

    fn environment(id: &str, ready: bool, free_gpus: u64) -> Environment {
        Environment {
            id: id.into(),
            host: format!("host-{id}"),
            ready,
            inventory: json!({ "gpus": free_gpus, "memory": { "free": 1024 } }),
        }
    }

    /// Each report as `full <id> <ready>` or `same <id>`.
    fn shown(reports: Vec<EnvironmentReport>) -> Vec<String> {
        reports
            .into_iter()
            .map(|report| match report {
                EnvironmentReport::Full(e) => format!("full {} {}", e.id, e.ready),
                EnvironmentReport::Same(id) => format!("same {id}"),
            })
            .collect()
    }

    /// A service whose `environments` panics.
    struct Panics;

    impl TrainingService for Panics {
        fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
            panic!("no hosts file")
        }
        fn start_trial(&mut self, _request: TrialRequest) -> Result<(), PluginError> {
            Ok(())
        }
        fn kill_trial(&mut self, _trial_id: &str, _reason: &str) -> Result<(), PluginError> {
            Ok(())
        }
        fn shutdown(&mut self) -> Result<(), PluginError> {
            Ok(())
        }
    }

    /// A panic in `environments` is named by that method, the one the plugin's author wrote,
    /// not by the request that carries it (it said "panicked in request").
    #[test]
    fn a_panic_in_environments_names_that_method() {
        let handle = training_service(
            "panics",
            |_event: Result<ServiceEvent, String>| {},
            |_events| Ok(Panics),
        )
        .unwrap();
        let error = handle.environment_reports().wait().unwrap_err().to_string();
        assert!(
            error.contains("training service panics panicked in environments: no hosts file"),
            "{error}"
        );
    }

    /// 200 lines with colour codes, as the hunt's tuner failed with.
    fn flood() -> String {
        "line one\nline two \x1b[31mRED\x1b[0m ".repeat(200)
    }

    /// Fails each call and emits each kind of event that carries its text with [`flood`].
    struct Floods(EventSink);

    impl TrainingService for Floods {
        fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
            Ok(Vec::new())
        }
        fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
            let (trial_id, text) = (request.trial_id, flood());
            self.0.emit(&ServiceEvent::Warning {
                trial_id: Some(trial_id.clone()),
                message: text.clone(),
            });
            self.0.emit(&ServiceEvent::StartFailed {
                trial_id: trial_id.clone(),
                message: text.clone(),
            });
            self.0.emit(&ServiceEvent::PlaceAgain {
                trial_id: trial_id.clone(),
                reason: text.clone(),
            });
            self.0.emit(&ServiceEvent::TrialEnded {
                trial_id,
                exit_code: None,
                signal: None,
                killed_reason: None,
                stderr_tail: text.clone(),
                environment_lost: Some(text.clone()),
                ended_ms: None,
            });
            Err(PluginError::new(text))
        }
        fn kill_trial(&mut self, _trial_id: &str, _reason: &str) -> Result<(), PluginError> {
            Ok(())
        }
        fn shutdown(&mut self) -> Result<(), PluginError> {
            Ok(())
        }
    }

    /// Fails `new` and `generate_parameters`, panics in `receive_trial_result`, each with
    /// [`flood`].
    struct FloodsTuner;

    impl Tuner for FloodsTuner {
        fn new(_class_args: &Value) -> Result<Self, PluginError> {
            Err(PluginError::new(flood()))
        }
        fn update_search_space(
            &mut self,
            _space: &crate::space::SearchSpace,
        ) -> Result<(), PluginError> {
            Ok(())
        }
        fn generate_parameters(
            &mut self,
            _parameter_id: u64,
        ) -> Result<crate::Generated, PluginError> {
            Err(PluginError::new(flood()))
        }
        fn receive_trial_result(
            &mut self,
            _parameter_id: u64,
            _parameters: &Value,
            _value: f64,
        ) -> Result<(), PluginError> {
            panic!("{}", flood())
        }
    }

    /// One line of visible text, bounded.
    fn assert_one_line(text: &str) {
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(
            text.chars().count() <= crate::host::MAX_PLUGIN_MESSAGE_CHARS + 200,
            "{} characters",
            text.chars().count()
        );
    }

    /// A plugin's error, panic, constructor failure and event text reach the host as one line
    /// of visible text, cut to a bound: passed on as sent, 200 lines with colour codes flooded
    /// the console, turned the terminal red and were stored so. A trial's stderr tail stays as
    /// the trial wrote it (the core makes its end message of its last visible line).
    #[test]
    fn a_plugins_text_reaches_the_host_as_one_bounded_line() {
        let tuner_error = |error: HostError| {
            let error = error.to_string();
            assert_one_line(&error);
            error
        };
        let generated = tuner("Floods", FloodsTuner)
            .generate_parameters(0)
            .wait()
            .unwrap_err();
        let said = tuner_error(generated);
        assert!(
            said.starts_with(
                "tuner Floods failed in generate_parameters: line one line two RED line one"
            ),
            "{said}"
        );
        assert!(said.ends_with('…'), "{said}");
        let panicked = tuner("Floods", FloodsTuner)
            .receive_trial_result(0, json!({}), 1.0)
            .wait()
            .unwrap_err();
        let said = tuner_error(panicked);
        assert!(
            said.starts_with(
                "tuner Floods panicked in receive_trial_result: line one line two RED"
            ),
            "{said}"
        );
        let built = service_object::<Floods>("floods", |_| {}, |_| Err(PluginError::new(flood())));
        let said = tuner_error(built.err().unwrap());
        assert!(
            said.starts_with("training service floods: constructor failed: line one line two RED"),
            "{said}"
        );

        let events = Arc::new(Mutex::new(Vec::new()));
        let kept = events.clone();
        let handle = training_service(
            "floods",
            move |event: Result<ServiceEvent, String>| kept.lock().unwrap().push(event.unwrap()),
            |events| Ok(Floods(events)),
        )
        .unwrap();
        let request: TrialRequest = serde_json::from_value(json!({
            "experiment_id": "e", "trial_id": "t1", "sequence": 0, "parameter_id": 0,
            "parameters": {}, "environment_id": "local", "command": "true", "code_dir": "/",
            "trial_dir": "/"
        }))
        .unwrap();
        let said = tuner_error(handle.start_trial(request).wait().unwrap_err());
        assert!(
            said.starts_with("training service floods failed in start_trial: line one"),
            "{said}"
        );
        let events = events.lock().unwrap().clone();
        assert_eq!(events.len(), 4, "{events:?}");
        for event in events {
            let text = match event {
                ServiceEvent::Warning { message, .. } => message,
                ServiceEvent::StartFailed { message, .. } => message,
                ServiceEvent::PlaceAgain { reason, .. } => reason,
                ServiceEvent::TrialEnded {
                    stderr_tail,
                    environment_lost,
                    ..
                } => {
                    assert_eq!(stderr_tail, flood());
                    environment_lost.unwrap()
                }
                event => panic!("{event:?}"),
            };
            assert_one_line(&text);
            assert!(text.starts_with("line one line two RED line one"), "{text}");
        }
    }

    #[test]
    fn only_changed_environments_are_sent_again_in_full() {
        let environments = Arc::new(Mutex::new(vec![
            environment("a", true, 2),
            environment("b", true, 2),
            environment("c", true, 2),
        ]));
        let sink = Arc::new(Mutex::new(None::<EventSink>));
        let (shared, kept) = (environments.clone(), sink.clone());
        let handle = training_service(
            "boxes",
            |_event: Result<ServiceEvent, String>| {},
            move |events| {
                *kept.lock().unwrap() = Some(events);
                Ok(Boxes {
                    environments: shared,
                })
            },
        )
        .unwrap();
        let ask = || shown(handle.environment_reports().wait().unwrap());
        // The first answer has every report in full; the same again has none.
        assert_eq!(ask(), ["full a true", "full b true", "full c true"]);
        assert_eq!(ask(), ["same a", "same b", "same c"]);
        // A GPU taken outside knob, a host lost, a host added: each of these in full, in the
        // service's order; one gone is no longer listed.
        {
            let mut environments = environments.lock().unwrap();
            environments[0].inventory["gpus"] = Value::from(1);
            environments[2].ready = false;
            environments.push(environment("d", true, 2));
        }
        assert_eq!(
            ask(),
            ["full a true", "same b", "full c false", "full d true"]
        );
        environments.lock().unwrap().remove(1);
        assert_eq!(ask(), ["same a", "same c", "same d"]);
        // A report the service sent as an event since replaces the one answered: sent in full
        // again, though it is the same as that one.
        let event = ServiceEvent::Environment {
            environment: environment("d", false, 0),
        };
        sink.lock().unwrap().as_ref().unwrap().emit(&event);
        assert_eq!(ask(), ["same a", "same c", "full d true"]);
        assert_eq!(ask(), ["same a", "same c", "same d"]);
    }
}
