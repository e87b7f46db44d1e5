//! Ending what a crashed run of an experiment left on its hosts, for `knob resume`, `knob stop`
//! and `knob experiment delete` of it (`TrainingService::clean_up_leftovers`). Its manager is
//! gone, and each host's agent daemon runs its trials on without it until its orphan timeout
//! (10 minutes): there, holding the host's GPUs, after the experiment was deleted.
//!
//! Each host of the stored `machineList` is reached as the service reaches it, and its daemon
//! of the experiment is told to shut down ([`ToAgent::Shutdown`]: every trial killed, then it
//! exits), which it confirms. A daemon itself killed outright (the OOM killer) left its trials
//! running without one: the daemon `attach` then starts ends them at its first hello, as it
//! does for a new manager, before it shuts down.

use std::sync::Arc;
use std::time::Duration;

use super::args::{Machine, RemoteArgs};
use super::host::{attach_command, manager_token};
use super::setup::{prepare_host, AgentBinary};
use super::ssh::{self, shell_quote, Connection};
use crate::agent::{DEFAULT_ORPHAN_TIMEOUT, SOCKET_FILE_NAME};
use crate::agent_protocol::{
    read_frame_async, write_frame_async, FromAgent, ToAgent, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT,
    PROTOCOL_VERSION,
};

/// How long one host may take in all (connection, set-up, the agent's shutdown and a second
/// try after a refusal); the hosts are reached at the same time.
const HOST_LIMIT: Duration = Duration::from_secs(120);
/// How long the agent may take to confirm its shutdown (it kills every trial first).
const CONFIRM_LIMIT: Duration = Duration::from_secs(20);
const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// What was left on one host.
enum Left {
    /// The experiment has no folder there: it never ran there.
    Nothing,
    /// Its agent shut down; `running`: the trials it ran then; `listening`: it was running
    /// (else `attach` started one, which ended trials left without an agent, if any).
    Ended {
        running: Vec<String>,
        listening: bool,
    },
}

/// How the agent took the request.
enum Answer {
    /// It shut down, after killing these trials.
    ShutDown(Vec<String>),
    /// It refused the hello (it serves another knob's experiment of this id, connected moments
    /// ago: perhaps the crashed one, whose connection it has not yet seen drop).
    Refused(String),
}

/// Ends, on every host of `args`, the experiment's agent and the trials it runs. Returns one
/// line per host where something was ended, or where it could not be, naming the trials of
/// `trial_ids` that may still run there.
pub async fn end_leftovers(
    args: RemoteArgs,
    binary: Option<AgentBinary>,
    trial_ids: &[String],
) -> Vec<String> {
    let args = Arc::new(args);
    let binary = binary.map(Arc::new);
    let manager = Arc::new(manager_token());
    let ends: Vec<_> = args
        .machines
        .iter()
        .cloned()
        .map(|machine| {
            let (args, binary, manager) = (args.clone(), binary.clone(), manager.clone());
            tokio::spawn(async move {
                let left = tokio::time::timeout(
                    HOST_LIMIT,
                    end_on_host(&args, &machine, binary.as_deref(), &manager),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "it did not answer within {} s",
                        HOST_LIMIT.as_secs()
                    ))
                });
                (machine.target(), left)
            })
        })
        .collect();
    let mut lines = Vec::new();
    for end in ends {
        let Ok((target, left)) = end.await else {
            continue;
        };
        match left {
            Ok(Left::Nothing) => {}
            Ok(Left::Ended { running, .. }) if !running.is_empty() => lines.push(format!(
                "killed {} left running on {target} by an earlier run, and its knob-agent",
                trials(&running)
            )),
            Ok(Left::Ended { listening, .. }) => {
                if listening {
                    lines.push(format!(
                        // "It ran no trial" read as a lie where trials had run there and
                        // ended while no knob listened: those run again.
                        "stopped the knob-agent left running on {target} by an earlier run (no trial was running there; any that ended there after that run was gone run again)"
                    ));
                }
            }
            Err(why) => {
                // An SSH error names the host already.
                let why = if why.starts_with(&target) {
                    why
                } else {
                    format!("{target}: {why}")
                };
                lines.push(format!(
                    "{why}: what an earlier run left there is not ended; of {}, those that ran there may still run, until its knob-agent stops them {} s after it last heard from knob",
                    trials(trial_ids),
                    DEFAULT_ORPHAN_TIMEOUT.as_secs()
                ));
            }
        }
    }
    lines
}

/// "trial a" or "trials a, b".
fn trials(ids: &[String]) -> String {
    match ids {
        [one] => format!("trial {one}"),
        _ => format!("trials {}", ids.join(", ")),
    }
}

async fn end_on_host(
    args: &RemoteArgs,
    machine: &Machine,
    binary: Option<&AgentBinary>,
    manager: &str,
) -> Result<Left, String> {
    let connection = ssh::connect(machine, &args.known_hosts_file, HEARTBEAT_INTERVAL)
        .await
        .map_err(|e| e.to_string())?;
    let left = end_agent(&connection, args, machine, binary, manager).await;
    connection.close().await;
    left
}

async fn end_agent(
    connection: &Connection,
    args: &RemoteArgs,
    machine: &Machine,
    binary: Option<&AgentBinary>,
    manager: &str,
) -> Result<Left, String> {
    let paths = prepare_host(connection, machine, args, binary)
        .await
        .map_err(|e| e.to_string())?;
    let dir = shell_quote(&paths.environment_dir);
    // No folder: nothing of the experiment ever ran there, and none is made for the asking.
    let found = connection
        .run(
            &format!(
                "test -d {dir} && echo ran && test -S {dir}/{SOCKET_FILE_NAME} && echo listening"
            ),
            None,
            COMMAND_LIMIT,
        )
        .await
        .map_err(|e| e.to_string())?
        .stdout_text();
    let said = |word: &str| found.lines().any(|line| line.trim() == word);
    if !said("ran") {
        return Ok(Left::Nothing);
    }
    let listening = said("listening");
    let hello = ToAgent::Hello {
        protocol: PROTOCOL_VERSION,
        experiment_id: args.experiment_id.clone(),
        environment_id: machine.environment_id(),
        last_seq: 0,
        fresh_start: false,
        new_experiment: false,
        manager: manager.to_string(),
    };
    // A refusal for another knob connected moments ago lasts until the agent has not heard
    // from it for a heartbeat timeout: the crashed knob's connection, dropped without a word,
    // counts as that until then. Asked again once after it.
    let command = attach_command(&paths);
    let mut answer = shut_down_agent(connection, &command, &hello).await?;
    if let Answer::Refused(_) = answer {
        tokio::time::sleep(HEARTBEAT_TIMEOUT + Duration::from_secs(1)).await;
        answer = shut_down_agent(connection, &command, &hello).await?;
    }
    match answer {
        Answer::ShutDown(running) => Ok(Left::Ended { running, listening }),
        Answer::Refused(message) => Err(format!("its knob-agent refused: {message}")),
    }
}

/// Attaches to the agent (`command`), says `hello`, and asks it to shut down.
async fn shut_down_agent(
    connection: &Connection,
    command: &str,
    hello: &ToAgent,
) -> Result<Answer, String> {
    let (stream, stderr) = connection
        .open_stream_keeping_stderr(command)
        .await
        .map_err(|e| e.to_string())?;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let no_answer = |e: String| {
        // `attach` says on stderr why it gave up (its daemon did not start, a full disk).
        let why = stderr
            .last_line()
            .map(|line| format!(" ({line})"))
            .unwrap_or_default();
        format!("its knob-agent did not answer: {e}{why}")
    };
    write_frame_async(&mut writer, hello)
        .await
        .map_err(|e| no_answer(e.to_string()))?;
    let welcome = tokio::time::timeout(ssh::CONNECT_TIMEOUT, read_frame_async(&mut reader))
        .await
        .map_err(|_| no_answer("no welcome in time".to_string()))?
        .map_err(|e| no_answer(e.to_string()))?;
    let (pid, running) = match welcome {
        FromAgent::Welcome { pid, running, .. } => (pid, running),
        FromAgent::Refused { message } => return Ok(Answer::Refused(message)),
        other => return Err(no_answer(format!("its first message was {other:?}"))),
    };
    write_frame_async(&mut writer, &ToAgent::Shutdown)
        .await
        .map_err(|e| no_answer(e.to_string()))?;
    // What it kept for the crashed knob comes first, then the trials' ends, then the
    // confirmation; all but the confirmation are dropped.
    let confirmed = tokio::time::timeout(CONFIRM_LIMIT, async {
        loop {
            match read_frame_async::<FromAgent>(&mut reader).await {
                Ok(FromAgent::ShutDown) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    })
    .await;
    match confirmed {
        Ok(Ok(())) => {
            wait_exited(connection, pid).await?;
            Ok(Answer::ShutDown(running))
        }
        Ok(Err(e)) => Err(format!(
            "its knob-agent closed the connection before it confirmed it stopped ({e})"
        )),
        Err(_) => Err(format!(
            "its knob-agent did not confirm it stopped within {} s",
            CONFIRM_LIMIT.as_secs()
        )),
    }
}

/// Waits (bounded) until the agent's daemon `pid`, which confirmed its shutdown, has exited: on
/// `knob resume` the new manager starts the next daemon in the same folder at once, and one
/// started while this one still holds the folder's lock gives up ("another daemon already
/// serves").
async fn wait_exited(connection: &Connection, pid: u32) -> Result<(), String> {
    let command = format!(
        "i=0; while kill -0 {pid} 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
         kill -0 {pid} 2>/dev/null && echo running"
    );
    let output = connection
        .run(&command, None, COMMAND_LIMIT)
        .await
        .map_err(|e| e.to_string())?;
    match output.stdout_text().trim() {
        "running" => Err(format!(
            "its knob-agent (pid {pid}) confirmed it stopped but still runs 10 s later"
        )),
        _ => Ok(()),
    }
}
