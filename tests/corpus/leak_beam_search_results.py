"""A translation service keeps every beam-search result (with its cache) "for later rescoring". Beam search
reorders the cache after every step, so the tensors the results end with are new ones each step.

expect: leak
holder: module __main__: RESULTS
"""

from _serve import MODEL, prompt

RESULTS = []

for i in range(8):
    RESULTS.append(MODEL.generate(prompt(i), max_new_tokens=4, num_beams=2, do_sample=False,
                                  return_dict_in_generate=True))
print("kept", len(RESULTS))
