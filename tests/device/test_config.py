"""Every ``NEURON_LAB_*`` variable is validated at import: a bad value fails there with an
error naming the variable and its allowed values (issue 15, item 5), never later in an op and
never silently replaced by the default."""
import os
import subprocess
import sys

import pytest

import neuron_lab
from neuron_lab.device import config


@pytest.fixture
def fresh_env(monkeypatch):
    """Validate against the patched environment, then re-read the real one."""
    yield monkeypatch
    monkeypatch.undo()
    for knob in config.KNOBS.values():
        knob.refresh()


@pytest.mark.parametrize("name,value,allowed", [
    ("NEURON_LAB_HBM_GB", "abc", "a number >= 0"),
    ("NEURON_LAB_HBM_GB", "-1", "a number >= 0"),
    ("NEURON_LAB_HBM_GB", "nan", "a number >= 0"),
    ("NEURON_LAB_COMPILE", "maybe", "one of 1, true, yes, on, 0, false, no, off"),
    ("NEURON_LAB_MODE", "bogus", "one of 'eager', 'adaptive'"),
    ("NEURON_LAB_FALLBACK", "cpu", "one of 'host', 'warn', 'error'"),
    ("NEURON_LAB_QUEUE_LIMIT", "1.5", "an integer >= 0"),
    ("NEURON_LAB_TRIALS", "-3", "an integer >= 0"),
])
def test_bad_value_names_the_variable_and_allowed_values(fresh_env, name, value, allowed):
    fresh_env.setenv(name, value)
    with pytest.raises(config.ConfigError) as e:
        config.validate_environment()
    msg = str(e.value)
    assert msg.startswith(f"{name}={value!r} is not valid") and allowed in msg


@pytest.mark.parametrize("name,value,expected", [
    ("NEURON_LAB_HBM_GB", " 2.5 ", 2.5), ("NEURON_LAB_COMPILE", "Off", False),
    ("NEURON_LAB_COMPILE", "yes", True), ("NEURON_LAB_MODE", "eager", "eager"),
    ("NEURON_LAB_HBM_GB", "0", 0.0),
])
def test_good_values_parse(fresh_env, name, value, expected):
    fresh_env.setenv(name, value)
    config.validate_environment()
    assert config.KNOBS[name].env_value() == expected


def test_in_process_settings_are_checked_the_same_way():
    with pytest.raises(config.ConfigError, match=r"NEURON_LAB_HBM_GB=-2 .*a number >= 0"):
        config.HBM_GB.set(-2)
    with pytest.raises(config.ConfigError, match="NEURON_LAB_MODE='fast'"):
        neuron_lab.set_mode("fast")
    with pytest.raises(config.ConfigError, match="NEURON_LAB_FALLBACK"):
        neuron_lab.set_fallback("ignore")
    assert neuron_lab.get_mode() in ("eager", "adaptive")


def test_unknown_variable_warns_with_the_closest_name(fresh_env):
    fresh_env.setenv("NEURON_LAB_MDOE", "eager")
    with pytest.warns(RuntimeWarning, match="NEURON_LAB_MDOE is not a neuron_lab setting.*"
                                            "did you mean NEURON_LAB_MODE"):
        config.validate_environment()


def test_import_fails_at_import_naming_the_variable():
    env = {**os.environ, "NEURON_LAB_MODE": "bogus"}
    r = subprocess.run([sys.executable, "-c", "import neuron_lab; print('imported')"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "imported" not in r.stdout
    assert "ConfigError: NEURON_LAB_MODE='bogus' is not valid: expected one of 'eager', " \
           "'adaptive'" in r.stderr


def test_a_bad_variable_fails_even_with_a_value_set_in_process(fresh_env):
    """``set_mode`` (an in-process value) does not hide a bad ``NEURON_LAB_MODE`` from the check
    (the suite ran this file after a test that left the mode set, and 'bogus' passed)."""
    from neuron_lab.runtime import knobs
    fresh_env.setenv("NEURON_LAB_MODE", "bogus")
    with knobs.MODE.scoped("eager"), pytest.raises(config.ConfigError, match="NEURON_LAB_MODE"):
        config.validate_environment()
