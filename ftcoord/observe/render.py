"""`ftcoord status` on a terminal: one job's view (ftcoord.observe.job_view.JobView) as rich tables, 80 columns."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ftcoord.observe.job_view import JobView, SlotView

_WIDTH = 79  # a line longer than the terminal wraps, and --watch's redraw jumps
_STATE_STYLE = {"stale": "yellow", "fenced": "red", "dead": "red", "replacing": "yellow", "spare": "cyan",
                "finished": "dim", "joining": "cyan"}


def render(view: JobView) -> Group:
    """The job's header, its slots, and (when there are any) still threads, recent generations and incidents."""
    return Group(_header(view), _slots(view), *_still(view), *_recent(view), *_incidents(view))


def _header(view: JobView) -> Text:
    leader = view.leader or {}
    lead = "none" if leader.get("slot") is None else f"{leader['slot']} (term {leader['term']})"
    target = "?" if view.target_world_size is None else str(view.target_world_size)
    ratio = "-" if view.effective_ratio is None else f"{view.effective_ratio:.1%}"
    rate = "-" if view.steps_per_s is None else f"{view.steps_per_s:.1f}/s"
    step = "-" if view.step is None else str(view.step)
    text = Text()
    text.append(f"job {view.job}", style="bold")
    text.append(f"  {view.state}  generation {view.generation}  world {view.world_size}/{target}\n")
    text.append(f"leader {lead}  step {step} @ {rate}  incidents {view.incident_count}, lost {view.lost_s:.2f}s  "
                f"effective {ratio}")
    return text


def _age(slot: SlotView) -> str:
    return f"{'>=' if slot.heartbeat_age_at_least else ''}{slot.heartbeat_age_s:.1f}s"


def _slots(view: JobView) -> Table:
    table = Table(title=None, box=None, pad_edge=False, header_style="bold")
    for name, justify in (("slot", "right"), ("state", "left"), ("inc", "right"), ("beat", "right"),
                          ("step", "right"), ("steps/s", "right"), ("restarts", "left"), ("pid", "right"),
                          ("standby", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for slot in view.slots:
        kinds = ",".join(f"{k}:{n}" for k, n in slot.restarts_by_kind.items() if n)
        restarts = f"{slot.process_restarts}p {slot.in_process_restarts or 0}i" + (f" {kinds}" if kinds else "")
        state = slot.state + (" (waiting)" if slot.waiting_on_peers and slot.state.startswith("rank") else "")
        table.add_row(str(slot.slot), Text(state, style=_STATE_STYLE.get(slot.state.split()[0], "green")),
                      str(slot.incarnation), _age(slot), "-" if slot.step is None else str(slot.step),
                      "-" if not slot.steps_per_s else f"{slot.steps_per_s:.2f}", restarts,
                      "-" if slot.pid is None else str(slot.pid), slot.standby or "-")
    return table


def _still(view: JobView) -> list[Text]:
    """Training threads standing still, not waiting on their peers, and where (ftcoord.liveness.still_stack): the
    slots the leader fences as hung at progress_timeout."""
    still = [s for s in view.slots if s.still_at]
    if not still:
        return []
    lines = Text("\nstanding still, not waiting on peers (stack: training_thread_still in its log)\n",
                 style="bold yellow")
    for slot in still:
        path, _, rest = (slot.still_at or "").rpartition(":")
        short = "/".join(path.split("/")[-2:])  # the package and file: the line must fit
        lines.append(f"  slot {slot.slot}: {short}:{rest}"[:_WIDTH] + "\n")
    return [lines]


def _recent(view: JobView) -> list[Text]:
    if not view.recent:
        return []
    lines = Text("\nrecent generations\n", style="bold")
    # How each ended: the root cause its successor's leader named, else the interrupt that ended it.
    ended = {g["generation"] - 1: g.get("cause") for g in view.recent}
    for g in view.recent:
        why = g["failed"] or ended.get(g["generation"]) or g["interrupted"] or "current"
        line = f"  {g['generation']:>5}  world {g['world_size']:<3} members {g['members']}  {why}"
        lines.append(line[:_WIDTH] + "\n")
    return [lines]


def _incidents(view: JobView) -> list[Text]:
    if not view.incidents:
        return []
    lines = Text("incidents (what each generation change cost)\n", style="bold")
    for i in view.incidents:
        lines.append(f"  gen {i['generation']:>4}  stall {i['stall_s']:.2f}s  lost {i['lost_steps']} steps  "
                     f"cost {i['cost_s']:.2f}s  {i['cause']}"[:_WIDTH] + "\n")
    return [lines]
