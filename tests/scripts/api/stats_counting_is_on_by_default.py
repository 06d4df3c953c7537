"""A fresh process counts without enable_stats, copies with their reasons,
in eager calls and in graphs; prints the counts, enable_stats(False)'s
result and the counts after it, one line each.

Run by tests/api/test_api_stats.py (tests/fresh_python.py)."""
import tensorflow as tf
import pyfunc_bridge as pfb

x = tf.zeros((2, 3))
pfb.numpy_function(lambda a: a, [x], tf.float32, name='shared')
tf.function(lambda x: pfb.numpy_function(lambda a: a.T, [x], tf.float32,
                                         name='copied'))(x)
s = pfb.stats()
print(s.enabled, s.functions['shared'].calls, s.functions['shared'].bytes_zero_copy,
      s.functions['copied'].calls)
print({k: v for k, v in s.functions['copied'].bytes_copied.items() if v})
print(pfb.enable_stats(False))
pfb.numpy_function(lambda a: a, [x], tf.float32, name='off')
print('off' in pfb.stats().functions, pfb.stats().enabled)
