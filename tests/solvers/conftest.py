import sys
from pathlib import Path

# Let solver tests import their small factories module by name.
sys.path.insert(0, str(Path(__file__).parent))
