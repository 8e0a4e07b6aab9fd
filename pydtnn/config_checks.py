"""Moved to `pydtnn.config` (the one validated run configuration); this name stays for existing imports."""
from pydtnn.config import *  # noqa: F401,F403
from pydtnn.config import (DIGEST_BITS, EXECUTION_FLAGS, PER_RANK_FLAGS, PRESENCE_FLAGS,  # noqa: F401
                           RESTORED_STATE, agree_on_flags, check_against_data, check_combinations, check_schedules,
                           describe_difference, first_difference, flag_dests, flag_digests, given_flags,
                           learning_rate_in_force, merge_resumed_flags, option_of)
