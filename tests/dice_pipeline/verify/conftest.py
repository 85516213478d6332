"""Makes the shared candidate catalogue (verify_cases.py) importable by the verifier tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
