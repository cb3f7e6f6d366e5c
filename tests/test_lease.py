"""The lease (mlops/lease.py) on a real SQLite registry: one holder at a time, renewed, taken over only once it
expired by the contender's own clock, released, or its holder's process gone; the generation fences a lost
holder's moves; many contenders at once: one wins."""

import os
import subprocess
import sys
import threading

import pytest
from mlflow import MlflowClient
from registry_fixtures import sqlite_uri

from consistency_gate.mlops import lease as leases
from consistency_gate.mlops.lease import TAG_PID, Lease, acting_as, fenced, lease_name
from consistency_gate.mlops.promotion import promote
from consistency_gate.mlops.tracking import LEASE_ENV


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client(tmp_path):
    uri = sqlite_uri(tmp_path)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("m")
    return client


def test_one_holder_renews_and_a_contender_takes_over_only_after_the_lease_expired(client):
    clock_a, clock_b = Clock(), Clock()
    a = Lease(client, "m", "a", duration_s=15, renew_deadline_s=10, clock=clock_a)
    b = Lease(client, "m", "b", duration_s=15, renew_deadline_s=10, clock=clock_b)
    assert a.try_acquire_or_renew() and a.held and a.name == lease_name("m", 1)
    assert not b.try_acquire_or_renew() and not b.held
    for _ in range(5):  # a renews every 2 s: b sees the lease change and never takes it
        clock_a.now += 2
        clock_b.now += 2
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock_a.now += 11  # a hangs: past its renew deadline it stops acting by itself
    assert not a.held
    clock_b.now += 14.9
    assert not b.try_acquire_or_renew()  # 14.9 s without a change seen: not yet
    clock_b.now += 0.2
    assert b.try_acquire_or_renew() and b.name == lease_name("m", 2)
    assert client.get_registered_model("m").tags[leases.TAG_POINTER] == "2"
    assert not a.try_acquire_or_renew() and a.generation is None  # a comes back: generation 2 is b's
    with acting_as(lease_name("m", 1)):
        assert "lost its lease on 'm'" in fenced(client)
    with acting_as(b.name):
        assert fenced(client) is None


def test_a_released_lease_or_a_dead_holder_on_this_host_is_free_at_once(client):
    a, b = Lease(client, "m", "a", clock=Clock()), Lease(client, "m", "b", clock=Clock())
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    a.release()
    assert b.try_acquire_or_renew() and b.generation == 2 and not a.held
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    client.set_registered_model_tag(b.name, TAG_PID, dead.stdout.strip())  # b's process has ended
    c = Lease(client, "m", "c", clock=Clock())
    assert c.try_acquire_or_renew() and c.generation == 3


def test_many_contenders_at_once_one_holds(client):
    contenders = [Lease(client, "m", f"c{i}", clock=Clock()) for i in range(8)]
    start = threading.Barrier(len(contenders))
    won = []

    def contend(lease):
        start.wait()
        if lease.try_acquire_or_renew():
            won.append(lease.holder)

    threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and sum(c.held for c in contenders) == 1


def test_a_wake_up_left_on_the_lease_reaches_its_holder(client):
    a, b = Lease(client, "m", "a", clock=Clock()), Lease(client, "m", "b", clock=Clock())
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    b.wake("model_version.created m v3")
    assert a.try_acquire_or_renew() and a.woken.endswith("model_version.created m v3")


def test_a_promotion_of_a_holder_that_lost_its_lease_is_refused(client, tmp_path):
    import mlflow
    from sklearn.dummy import DummyClassifier

    mlflow.set_tracking_uri(client.tracking_uri)
    mlflow.set_registry_uri(client.tracking_uri)
    mlflow.set_experiment("training")  # not the experiment an earlier test in this worker made active
    with mlflow.start_run():
        model = DummyClassifier().fit([[0], [1]], [0, 1])
        mlflow.sklearn.log_model(model, name="model", registered_model_name="m", pip_requirements=["scikit-learn"])
        mlflow.sklearn.log_model(model, name="model2", registered_model_name="m", pip_requirements=["scikit-learn"])
    client.set_registered_model_alias("m", "champion", "1")
    clock_a, clock_b = Clock(), Clock()
    a, b = Lease(client, "m", "a", clock=clock_a), Lease(client, "m", "b", clock=clock_b)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock_b.now += 16
    assert b.try_acquire_or_renew()
    os.environ[LEASE_ENV] = a.name  # as a gate started by a is started
    try:
        moved = promote(client, "m", "champion", "2", "1", owner="a gate of a")
    finally:
        del os.environ[LEASE_ENV]
    assert moved.promoted is False and moved.refused and "lost its lease on 'm'" in moved.reason
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    with acting_as(b.name):
        assert promote(client, "m", "champion", "2", "1", owner="a gate of b").promoted is True
