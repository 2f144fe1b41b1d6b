# A module that starts a thread when imported: unsafe to fork after, so --preload refuses it.
import threading
import time

threading.Thread(target=time.sleep, args=(60,), daemon=True, name="import-thread").start()
