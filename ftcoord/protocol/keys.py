"""Names of every key a job writes, under its own prefix `ftcoord/<job_id>/`.

Kept in one module so the protocol's layout can be read in one place.
"""

from __future__ import annotations

SLOTS = "slots"  # append-only list "slot,slot,..." of every slot that ever registered
LEADER = "leader"  # "term:slot:incarnation" of the process that proposes records
CURRENT = "gen/current"  # a hint: the newest decided generation (walk forward to be sure)
DONE = "done"  # set when the job completed: every process exits 0
STOP = "stop"  # "generation:slot:incarnation" of the first process asked to stop (SIGTERM)
FATAL = "fatal"  # the message of a fatal error: the whole job ends with it
STOPPED = "stopped"  # the generation in which every member returned through should_stop
INFO = "info"  # JSON: the job's heartbeat timing and start time, for observers (ftcoord.protocol.jobs)
LISTED = "listed"  # the first process to set it (a token of its own) lists the job in the store's index (protocol.jobs)
# "instance" holds "epoch:nonce", which life of the store server this is: the store layer reads and writes it
# (ftcoord.store.link.INSTANCE_KEY), below the protocol.
INCIDENTS = "incidents"  # append-only JSON lines: what each generation change cost (ftcoord.protocol.slot_report)
# counter: whole-job restarts asked (`--restart-policy job`: ftcoord.launcher.job_restarts)
JOB_RESTARTS = "job_restarts"


def probe(generation: int) -> str:
    """PROBE_ASKED when a leader asks every live member of `generation` to beat now (ftcoord.protocol.evidence); else
    PROBE_RELEASED once the next generation is decided, which releases the members' monitors from waiting for it."""
    return f"gen/{generation}/probe"


PROBE_ASKED = "beat"
PROBE_RELEASED = "decided"  # not a question: a monitor that reads it does not have its heartbeat beat


def status(slot: int) -> str:
    """JSON: the slot's live process's generation, rank, step, steps/s, restarts (ftcoord.protocol.slot_report)."""
    return f"slot/{slot}/status"


def launcher(slot: int) -> str:
    """JSON: the launcher that runs the slot: host, pid, restarts by kind, its warm standby."""
    return f"slot/{slot}/launcher"


def registered(slot: int) -> str:
    return f"slot/{slot}/registered"


def incarnation(slot: int) -> str:
    """Counter bumped by every process that starts for this slot."""
    return f"slot/{slot}/incarnation"


def heartbeat(slot: int) -> str:
    """Counter bumped by the heartbeat thread of the slot's live process."""
    return f"slot/{slot}/hb"


def progress(slot: int) -> str:
    """`<pings>[/<step>][@<still_s>,<generation>][:w]`: the count of `ping()`s from the training thread, the step it
    last committed in its generation, how long it has stood still on its own in which generation, and whether it waits
    on its peers (ftcoord.liveness.heartbeat)."""
    return f"slot/{slot}/progress"


def dead(slot: int) -> str:
    """The highest incarnation of the slot known dead (fast path for local parents)."""
    return f"slot/{slot}/dead"


def replacing(slot: int) -> str:
    """"incarnation:beat": the incarnation a launcher is starting for the slot right now; the launcher
    bumps the beat while it is on its way, so the leader can tell "still starting" from "given up"."""
    return f"slot/{slot}/replacing"


def left(slot: int) -> str:
    """The incarnation of the slot that left on purpose (exited cleanly)."""
    return f"slot/{slot}/left"


def fence(slot: int) -> str:
    """"term:incarnation": the incarnation of the slot a leader of that term declared dead: its launcher
    kills it, unless a newer leader term holds the `leader` key by then ("0" until a first fence)."""
    return f"slot/{slot}/fence"


def record(generation: int) -> str:
    """The immutable record of a generation, written once with compare_set from absent; when the
    generation is forgotten its value becomes FORGOTTEN, never absent again (see ftcoord.leader.duty)."""
    return f"gen/{generation}/record"


FORGOTTEN = "forgotten"
"""The tombstone an old generation's record becomes: the key stays, so compare_set(record, "", ...) of a
leader that paused before writing it fails instead of writing the generation a second time."""

ENDED = "ended"
"""The record of the generation after the job's last one: the job ended (done, stopped or failed), and nothing will
be decided under this number. Written with compare_set from absent, like a record, by whoever ends the job (the
last member to finish; a leader that finds the job failed), so every process waiting for that record (a hot spare,
a member rejoining after a fatal error) wakes at once, where it waits, instead of looking at the job's end after
every slice of its wait (ftcoord.wrapper.generation_client). A number whose record is ENDED counts as decided
(gen/current walks over it), so a stopped job that is launched again decides the numbers after it."""


def joiners(generation: int) -> str:
    """Append-only list of join announcements (JSON lines) for a generation; its lines are their count."""
    return f"gen/{generation}/joiners"


HEARTBEAT_STALE, HUNG, GONE = "heartbeat_stale", "hung", "gone"
DEATH_REASONS = (HEARTBEAT_STALE, HUNG, GONE)
"""Why the leader interrupts a generation for one of its members (`<reason>:slot=<member>`): it is dead or fenced
(its peers read them: ftcoord.liveness.group_release)."""


def interrupt(generation: int) -> str:
    """Set (with a reason) to end a generation: every member leaves and rejoins."""
    return f"gen/{generation}/interrupt"


def released(generation: int) -> str:
    """Set once ("<reason>:slot=<member>", first wins) when the leader declares a member of this generation dead after
    another reason had ended it: a member still blocked in one of its collectives shuts its group down
    (ftcoord.liveness.group_release); none is written when the death itself ended the generation (its interrupt
    says so)."""
    return f"gen/{generation}/released"


def finished(generation: int) -> str:
    """Hint of how many members' functions returned in this generation (ftcoord.protocol.tally: finished_by is the
    truth)."""
    return f"gen/{generation}/finished"


def finished_by(generation: int, slot: int) -> str:
    """Set once when `slot`'s function returned in this generation: "done", or "stop" (it returned to stop)."""
    return f"gen/{generation}/finished/{slot}"


def addresses(generation: int) -> str:
    """Append-only "slot host:port,..." lines: each member's end of its group's connections."""
    return f"gen/{generation}/addresses"


def evidence(generation: int) -> str:
    """Append-only "leaving <slot>" / "closed <slot> <reporter>" / "raised <slot> <error>" lines (see
    ftcoord.protocol.evidence)."""
    return f"gen/{generation}/evidence"


def arrived(generation: int) -> str:
    """Hint of how many members reached the generation's rendezvous (ftcoord.protocol.tally: arrived_rank is the
    truth; see ftcoord.wrapper.call)."""
    return f"gen/{generation}/arrived"


def arrived_rank(generation: int, rank: int) -> str:
    """Set once when the member of `rank` reached the generation's rendezvous."""
    return f"gen/{generation}/arrived/{rank}"


def all_arrived(generation: int) -> str:
    """Set by the last member to arrive: every member is at the rendezvous."""
    return f"gen/{generation}/all_arrived"


def process_group(generation: int) -> str:
    """Prefix of the torch.distributed rendezvous keys of a generation."""
    return f"gen/{generation}/pg"


def gloo_rendezvous(generation: int, rank: int) -> str:
    """The key gloo's full-mesh rendezvous writes for `rank` under process_group(generation): the default group
    ("0"), its CPU device, its first context (gloo's layout in torch 2.14). Its host's name and address, ~150 bytes
    whatever the world size with the options ftcoord sets (ftcoord.wrapper.call.GLOO_RENDEZVOUS_OPTIONS; 8 bytes
    more per peer without them): forgotten with the generation (ftcoord.protocol.generations.forget)."""
    return f"{process_group(generation)}/0//cpu//0/{rank}"
