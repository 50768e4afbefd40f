"""Write an example class-per-folder image tree for the ImageFolder dataset (offline).

The command line of :mod:`vlprompt_app.commands.make_image_folder` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.make_image_folder import main

if __name__ == "__main__":
    sys.exit(main())
