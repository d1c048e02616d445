"""Online tree-budget control: pick each verify step's budget N to maximise tokens per second.

Contract
--------
Pure logic: no torch, no model call, no clock (every time comes in through a :class:`StepRecord`),
no randomness: the same records give the same budgets. The decoding loop
(:func:`talon_sd.decoding.decode`) calls, every verify step::

    next_budget(catch_up_tokens, tokens_left)
                                     N for the coming step, 1 <= N <= max_budget (root counted; N = 1 is a
                                     plain decoding step: no draft forward, the target verifies the root);
                                     the drafter's pending catch-up and the tokens still allowed (design 6)
    keep_growing(tree_log_p, frontier, widths_so_far, budget)
                                     asked by the builder before each draft forward but the first
    observe(StepRecord)              what the step built, accepted and cost

and reads ``reason`` after ``next_budget`` (why N: a key of :data:`REASONS`) into the step's stats.

The controller decides how many tokens are drafted, never which tokens are emitted: losslessness does
not depend on it. Quantities follow :mod:`talon_sd.verify`: a step that accepts ``a`` draft tokens
commits ``a + 1`` (the bonus token included); the rate of a budget is committed tokens per second.

The prefix property (what makes one step informative about every smaller budget)
------------------------------------------------------------------------------------
The loop reports the tree's nodes in the builder's *inclusion order* (root first): the tree built
with budget k is exactly the first k nodes of the tree built with any budget M >= k (TALON,
Algorithm 2 of arXiv 2601.07353: whole layers, the last one cut to the best N - |T| by score; chain;
EAGLE after its global rerank). Greedy acceptance of a prefix tree is the big tree's accepted path
cut at the first node of position >= k (positions increase along a path). So one verified step of
size M gives, for every k <= M, the accepted length and the draft forwards budget k would have run
(:func:`prefix_outcome`); a step that stopped short of its budget (``complete``) gives the same for
every k > M. Under sampling this is an approximation; it only steers the budget.

Design ("Improvement" marks where this goes past the obvious recipe)
------
1. Costs (:class:`CostCurve`): verify seconds by tree size, draft seconds by forward width, and the
   rest of a step (tree building, cache commit, bookkeeping) by the number of draft forwards (0 = a
   plain step: this subsumes the plain / drafted split and charges per-layer Python work to the
   layers). Each keeps the last ``cost_samples`` samples per size; the curve is the median per size,
   made non-decreasing by weighted isotonic regression (pool-adjacent-violators, weights = sample
   counts) and interpolated linearly. Improvement: isotonic regression rather than a running max, so
   one slow outlier at a small size does not lift every larger size. Outside the known sizes the curve
   goes on with the larger of the last segment's and the whole curve's slope (never negative; floored
   at 0 below), so a tree size never measured is neither free nor as dear as the largest one. A
   :class:`CostPrior` seeds the points; once sizes are measured, unmeasured prior points are scaled by
   the median measured/prior ratio (a longer context or a busier machine moves the whole curve).
   Improvement: the first draft forward of a step that follows a plain step also forwards the tokens
   the plain steps committed (the drafter's catch-up, :class:`talon_sd.drafters.ModelDrafter`); that
   sample is left out of the width table, so a run of plain steps does not make drafting look dear.
2. Acceptance, counterfactually: each drafted step becomes a sample holding, for every candidate
   budget it informs, (committed tokens, tree size, draft forwards). Each candidate keeps its last
   ``window`` informing samples, weighted ``0.5 ** (age / half_life)``; a sample's seconds are
   recomputed from the current curves (overhead(forwards) + draft(widths it needs) + verify(size)),
   and a candidate's rate is a ratio of sums, ``sum w tokens / sum w seconds``, trusted from
   ``min_steps`` samples on. Plain steps inform nothing about acceptance; rate(1) = 1 / (overhead(0)
   + verify(1)) comes from the costs alone. Improvement (chained paired estimates): candidates above
   the current choice are informed only by probes, which are few and may be old, and a candidate
   just chosen would otherwise be judged on those stale probes. Every step that informs k informs
   every smaller budget, so the smallest trusted drafted candidate takes its own rate and each larger
   one k the rate of the previous trusted candidate j times ``R_k(S_k) / R_j(S_k)``, how k did
   against j on the steps that inform k. Where all candidates share their samples (at or below the
   choice) this telescopes to the plain ratio of sums; above it, what the steps had in common (an
   easy stretch of code, a change of text) cancels, so a lucky or stale probe does not decide alone.
3. Choice and exploration: the choice is the trusted candidate of highest rate (a tie keeps the
   current choice, then goes to the smaller budget); an untrusted first choice (``initial_budget``)
   is kept until trusted unless even its optimistic rate loses to a trusted one. Step 1 is plain when
   verify(1) has fewer than ``min_steps`` measured samples (step 0 runs ``initial_budget``), and a plain
   step re-measures it every ``plain_refresh_interval`` steps (design 13). A *trial* runs the probe budget for ``probe_steps`` steps (more
   while it has fewer than ``min_steps`` samples); a probe of size P informs every candidate <= P at
   once. The probe is the smallest candidate >= ``probe_factor`` x the choice and >= ``initial_budget``
   (from plain, ``plain_probe_budget``): from a choice that fell to N = 2-3 after a poor stretch,
   twice the choice is too small to show what the budgets it left would do (alpaca, section 5). Trials start ``min_probe_interval`` steps apart; the interval doubles each
   time a trial does not move the choice up, up to ``max_probe_interval``, and resets when one does.
   Improvements: (a) from plain decoding, each lost trial aims twice as far as the last
   (``probe_levels`` levels, then over), because the rate need not be unimodal in N there: on the
   measured float32 CPU curve with code-like acceptance (tests/test_control.py) budgets 2-5 lose to
   plain decoding while 8 wins (one draft forward more for about the same verify cost); from a drafted
   choice the probe stays at the next rungs (design 10; with ``lean_margin`` > 0, the lean rung: design 17); (b) dominance: a probe is
   skipped (and counted as lost) when even its optimistic rate, ``max over F < k of (F + 1) /
   (overhead(F) + F draft(1) + verify(k))`` (each draft forward adds at most one layer, so F forwards
   accept at most F drafts), is below ``(1 - dominance_margin)`` x the current rate: where verifying
   T tokens costs T one-token steps the controller settles on N = 1 at step 2 and never probes again,
   while where costs leave room it keeps probing from plain, however bad the acceptance has been.
4. Early stop inside a step (:meth:`BudgetController.keep_growing`): a :class:`Calibration` over bins
   of cumulative draft log p (``calibration_edges``) learns a(p) = P(node accepted) and e(p) =
   P(one of its children accepted | it was expanded), as Beta posteriors (prior a = e^p at the bin's
   middle, e = 0.7 a; ``calibration_prior_strength`` pseudo-nodes) decayed by ``calibration_decay``
   per drafted step. Improvement: "expanded" means fed to a draft forward when the record shows it
   (layered records: forward j expands the layer forward j - 1 added), not merely "has children",
   since a TALON frontier node whose children all fail the gate was expanded for nothing; and the
   parents of a layer the budget cut are left out, as they lost children to the budget, not to the
   draft. With A = sum of a over the tree's non-root nodes (the best budget - 1 of them), g = sum of e
   over the frontier, T_now = overhead(F) + draft(widths so far) + verify(min(size, budget)), and
   T_next adding one forward of the frontier's width and verify(min(budget, size + b |frontier|))
   (b = nodes added per expanded node in the records' later layers), growth goes on iff
   (A + g + 1) / T_next > (A + 1) / T_now. With no drafted step seen yet it always says grow. In the
   synthetic worlds of tests/test_control.py this recovers most of what too large a budget loses
   (a fixed N = 64 on the bf16 CPU curve: 0.67 -> 0.99 of the best fixed N) and costs at most ~1%
   near the optimum; a margin in either direction did worse. **Off by default**
   (``early_stop=False``): on the real Qwen pair in bf16 (docs/BENCHMARKS.md section 5) the one-layer
   look-ahead stopped chat trees after the root's children in almost every step (a deeper tree pays
   only over several layers), such steps count as ``complete`` for every larger budget, every budget
   then looked alike and the choice collapsed to N = 2-4 (MAT 2.0 where N = 16 accepts 4.5).
5. Cost: on this project's 2-core CPU (Python 3.11, the machine busy with other work, load ~4) with
   the defaults (window 32, 16 candidates), next_budget + observe took 0.17-0.33 ms per step together
   (mean trees of 5 to 60 nodes; 0.33 ms with 64-node trees every step) and keep_growing 4-14 us per
   call. Per step the work is O(window x candidates), plus O(known sizes) to refit the cost curves.

6. The drafter's catch-up. A draft LM forwards nothing on plain steps and its prompt only at the first
   drafted step (lazy prefill): the first drafted step of a request forwards the whole prompt (700
   tokens on CNN/DM), later ones the plain steps' tokens. The loop passes ``catch_up_tokens``
   (:attr:`talon_sd.drafters.Drafter.catch_up_tokens`) and ``tokens_left``; the first forward of such a
   step, less draft(width), is a sample of a catch-up curve by tokens (bucketed to powers of two,
   scaled to the bucket). A drafted choice k then runs only if drafting the expected rest E of the
   sequence saves more than the catch-up costs, ``E (1 / rate(1) - 1 / rate(k)) > catch_up(P)``,
   else the step is plain (the catch-up keeps waiting; ``catch_up_skips`` in the summary); a trial
   starts only if its catch-up is at most ``trial_cost_share`` of E's plain seconds (design 11
   adds what the probe's last trials lost). E is
   ``tokens_left`` capped by the median length of the last finished sequences (a QA answer of 20
   tokens does not earn back a prefill over max_new_tokens = 128; one cut by its token limit counts
   as endless). Before a catch-up was measured it
   costs nothing (as before). Measured in tests/test_control.py: float32 costs, code-like acceptance,
   a 700-token prompt and 12-step answers: 0.68 of plain when not told, level with plain when told;
   where drafting pays (bf16 costs) the prefill is paid. On the real pair (hostile float32 reading of
   docs/BENCHMARKS.md section 5) qa went from 0.68x to 1.00x of ar; a long prompt whose carried rates
   promise more than its prefill still pays it (sum, 0.77x: the carried choice, not the prefill,
   is most of that loss).
7. Carried samples at a new sequence (:meth:`BudgetController.for_next_sequence`) are scaled by one
   factor so that no candidate's total weight exceeds ``carried_weight`` (8) steps: rates (ratios of
   sums) are unchanged at the start, and after a few steps of its own the new request's acceptance
   decides. The motivating runs: qa after sum (bf16 sweep, 0.72 of the best fixed N) and sum/qa after
   humaneval (hostile float32, 0.92x/0.68x of ar), where 32 carried samples outweighed a short
   request's 2-12 steps. In the synthetic code -> chat switch (6-step requests, 3 seeds) 8 gave 0.93
   of the best fixed N against 0.91 uncapped; 4 or less lost on the hostile carried test (0.95 of
   plain against 0.97). On the real pair (bf16 sweep, docs/BENCHMARKS.md section 5) it moved gsm8k
   from 0.91 to 0.95 of the best fixed N but not qa (0.72 -> 0.76): 2-7-step requests are still
   decided by 8 carried steps' worth, and carried trials land inside them.

8. Change points and bounded exploration. (a) A new sequence's first ``release_steps`` drafted steps are
   compared with the carried samples at the largest budget they all inform; when their mean committed
   tokens differ by more than ``release_ratio`` (1.5) and by more than ``RELEASE_Z`` standard errors (or, design
   47, all of them accepted nothing and a run that long is unlikely among the carried steps), the
   text has changed (code -> news summary) and the carried samples are scaled down to one step's weight
   in all: the sequence's own steps decide from then on, while budgets it has not tried keep what the
   carried probes said of them. The motivating run: hostile float32, sum after humaneval (0.77x of ar):
   carried samples committing ~25 tokens a step at N = 32 against sum's ~7 kept 20-64-node trees for the
   whole first sum request even capped at 8 steps' worth. In tests/test_control.py's code -> poor-text
   switch the budget falls within the 12-step request (seen after 2-6 drafted steps); on unchanged text it
   does not fire. The z-test matters: a ratio test alone fired on a 3-step poor stretch of code. (b) A trial
   starts only while the seconds trials lost against the rate of the choice they left (signed: a won
   trial gives its loss back) are at most ``exploration_share`` (5%) of the observed seconds, both weighted
   by age with ``exploration_half_life`` (64 steps): the regret of exploration is bounded locally. Counted
   over the whole run (half-life inf) the bound never bound on the real pair: by the qa requests of the
   hostile float32 reading (docs/BENCHMARKS.md section 5, fourth reading) ~700 s had been observed, and
   three 2-step trials cost 0.83x of ar there. In the synthetic short-request worlds the local bound is
   -2% to +4% against no bound (24-token requests, float32/bf16 x code/chat).
9. Tokens left, conditioned on the sequence so far: E is the median of what the last ``LENGTHS_KEPT`` (3)
   finished sequences that outlasted this one's tokens so far went on to commit (15 tokens into a run of
   20-token answers, 5 are left), capped by ``tokens_left``; three, not sixteen, so that a run of short
   answers after long ones is seen by the third.

10. (With ``lean_margin`` > 0, design 17 replaces this: the probe is the lean rung.) Probes from a drafted choice stay near it: the probe is always the smallest candidate >= max(``probe_factor``
   x choice, ``initial_budget``); only from plain decoding do lost trials aim further (design 3a). Between
   two drafted budgets the rate is about unimodal in N (a node more costs a little more verify, a layer
   more one draft forward), and a probe of 8 from N = 3 informs every rung 4-8 at about the cost of one
   more draft forward. The motivating run (bf16 sweep, docs/BENCHMARKS.md section 5, sweep 8): sum and
   mt_bench requests sat at N = 2-3 for 30-60 steps (auto 0.87 and 0.96 of the best fixed N) while their
   trials, twice as far after each loss, went to 32-64 nodes, lost, doubled the interval and used up the
   exploration bound. In tests/test_control.py's poor -> better text switch (bf16 costs) the request
   reaches a median 0.98 of its best fixed N (0.95 before); levels from plain stay (the float32 code
   world left plain decoding for N = 8 at 0.95-0.98 of the best with them, 0.93-0.97 without). On the real
   pair (sweep 9): sum 0.87 -> 0.99 and qa 0.91 -> 0.99 of the best fixed N, steps at N = 2-3 on sum 148 of
   183 -> 0 of 72. Not handled: a drafted choice that only plain steps ran (catch-up skips through whole
   long-prompt requests) still seeds a trial at twice its size; at float32 and T = 1 that opened a QA
   request with 40 nodes (section 5, sixth hostile reading): design 11.

11. What a trial may cost a request. (a) A trial starts only if its catch-up plus what the last trials of
   the same probe budget lost against the choice's rate (their catch-up left out; a running mean that
   halves the old value at each new trial; a won trial counts its gain as nothing) is at most
   ``trial_cost_share`` (5%) of the plain seconds of the tokens the sequence is expected to have left
   (design 9's E; the bound was 10% and on the catch-up alone before); otherwise it is postponed to the
   next step (``probes["postponed"]`` counts such steps; the schedule is unchanged). Design
   6 bounded only the catch-up, and design 8's exploration bound is local in steps, not in requests: in
   float32 at temperature 1 (docs/BENCHMARKS.md section 5, sixth hostile reading) every trial from plain
   decoding lost, and one 2-step trial of 16 nodes on a 16-token QA answer cost a fifth of it, while the
   same trial on a 64-token answer costs 5%. A probe never tried is not bounded beyond its catch-up, so
   a change of text or machine is still found. (b) A drafted choice that ran no drafted step in this
   sequence or the previous one (all its steps catch-up skips, design 6) runs itself before a trial
   probes above it: a trial is judged against the choice's rate, and that rate was learned on other text.
   In the synthetic bench-like float32 sequence (runs of 2 requests per dataset, 8 seeds, chat / medium /
   code acceptance at temperature 1; 16-token QA answers) the mean per-dataset ratio to plain went from
   0.88-1.00 to 0.94-1.00 (qa 0.88 -> 1.00, gsm8k 0.94 -> 0.99, humaneval 0.96 -> 1.00); mt_bench's first
   request, where a fresh controller learns its costs, stays the lowest (0.91 -> 0.94). The bf16
   scenarios of design 10 were unchanged or better (short chat requests 0.976 -> 0.983 of the best fixed N).

12. The target's confidence says what text it is (:class:`Predictability`). Every step, a plain one too,
   reports the target's top-1 probability before each token it commits (``StepRecord.confidence``, one
   softmax row per committed token, 0.3-1 ms a step on this CPU). On 40 training answers of the packaged
   Qwen pair (teacher-forced, bf16) the 0.5B draft's greedy token matched the 1.5B target's with
   probability 0.36 / 0.48 / 0.65 / 0.85 / 0.95 / 0.99 at target confidence < 0.3 / 0.3-0.5 / 0.5-0.7 /
   0.7-0.9 / 0.9-0.97 / >= 0.97, and per answer the mean confidence and the agreement correlate (r = 0.73):
   what plain steps see predicts what drafting would accept, for free. The controller learns, per bin of
   confidence, how often the tree held the token the target committed next (decayed Beta posteriors over
   every expanded accepted-path position; prior: the draft's top-1 misses at rate 1 - q and the tree
   catches half of that), and replays the last ``confidence_window`` (16) confidences as a chain: the
   tokens a step of F forwards would commit on text like that. A budget's predicted rate is that over the
   seconds its own informing samples cost (their forwards and tree sizes; from any text, as cost hardly
   depends on it), or, without samples, the optimistic chain bound of design 3b. From plain decoding,
   (a) a due trial runs the largest probe level (design 3a) whose predicted rate reaches (1 -
   ``dominance_margin``) of plain decoding's, and is postponed while none does (``probes["unpredictable"]``
   counts such steps; the schedule is not pushed back, so the trial runs when the text allows); (b) a
   probe level predicted to beat plain decoding by ``PREDICTED_WIN`` (10%) starts a trial before it is
   due, at most once every ``min_probe_interval`` steps after the last trial: a change to predictable
   text is tried when it shows, not when the doubled interval says. Both are still bounded by designs 8
   and 11. Improvement over designs 8-11, which bound what trials may lose but place them blindly: those
   runs' trials from plain decoding fell on chat (hostile float32 readings 4-7, all lost) while the code
   requests where drafting wins in float32 (readings 3-4, 1.1-1.2x) got none. In tests/test_control.py's
   float32 chat -> code sequence (N = 8 is 1.13x plain on the code) the chat requests went from 0.966 to
   0.982 of plain and the code requests from 1.003 to 1.029. In a bench-like float32 sequence of six
   dataset-like worlds (2 requests each, 8 seeds, greedy- and T = 1-like acceptance) the chat-like ones
   rose from 0.94-0.98 to 0.97-1.00 of plain, while a code world where no fixed N beats plain fell from
   1.00 to 0.98-0.99 and 16-token QA answers from 1.00 to 0.99 (trials now run there, and lose); bf16
   scenarios were level or better (a request after 40 poor steps: worst 0.68 -> 0.92 of the best fixed N).

13. Plain decoding's rate is measured, not sampled once: a plain step is due while verify(1) has fewer than
   ``min_steps`` measured samples (unless a prior gives it), and ``plain_refresh_interval`` is 64 steps
   (was 256). Every drafted rate is judged against rate(1), so one stalled measurement of it (a plain step
   2.5x slower than usual) made every drafted budget look faster than plain decoding until the next refresh.
   The float32 reading 8 (docs/BENCHMARKS.md section 5) drafted every step of 18 of 21 requests, 0.91x of
   plain overall, and ran no plain step in them; two instrumented replays of its first requests measured
   verify(1) in their first plain steps and went plain within 8 steps, as the reading before did (0.99x):
   one early, slow sample is the likely cause (the runs keep no per-step seconds to show it). In
   tests/test_control.py's float32 chat world with such a stall: 0.69-0.76 of plain before, plain decoding
   again within 16 steps since. Cost: two more plain steps once per generator, and one plain step in 64
   (on a machine where drafting wins 1.5x, ~0.5%).

14. A new request's catch-up is not paid on the last requests' rate alone. At a new sequence the draft LM must
   first forward the whole prompt; design 6 pays that when expected tokens x (1 / rate(1) - 1 / rate(N)) exceeds
   it, with rate(N) learned on the requests before. When that rate pays the catch-up back less than
   ``CATCH_UP_MARGIN`` (2) times over, the request first runs plain steps until ``OWN_CONFIDENCES`` (4) of its own
   target confidences are in, and then pays only if the smaller of the carried rate and the rate those predict
   (design 12) pays it back. Also: the catch-up curve extrapolates past its largest measured bucket at least
   linearly in tokens (a flat curve charged a 709-token prompt as the 128-256 tokens measured before), and a
   trial cut by the end of its sequence is judged there instead of running its last step as the next
   request's first (which paid that request's catch-up for a probe). In the float32 reading 9 the first sum
   request (709-token prompt) inherited humaneval's choice of 24 nodes and lost (0.74x of ar); in
   tests/test_control.py's float32 code -> long-prompt chat sequence: 0.80-0.83 of plain in 3 of 6 seeds
   before, 1.00 in all since. Cost: in bf16, code requests with a 700-token prompt and a 36-token answer
   went from 1.20x to 1.12x of plain (4 plain steps first); requests whose catch-up pays back twice over
   (every bf16 case of 64+ tokens in the synthetic worlds) are unchanged.

15. A trial may pay more catch-up when the request's own text predicts a win that pays it back. Design 11's share
   (``trial_cost_share``, 5% of the expected rest's plain seconds) is flat: in float32 the draft LM's catch-up over
   a 200-token prompt plus the plain steps since costs more than that on a 64-token answer, and in the float32
   reading 11 (docs/BENCHMARKS.md section 5) 884 of 1,113 steps were ``trial-catch-up``, all of humaneval's but
   7. From plain decoding, a trial over the share still starts when the best probe rung's rate predicted from the
   sequence's own last ``confidence_window`` (16) target confidences (design 12; none before 16 are in) saves,
   over the expected rest, at least ``CATCH_UP_MARGIN`` (2) times the catch-up plus the probe's past losses.
   In ``scripts/controller_scenarios.py`` (16 seeds): float32 code, where 1 seed stayed plain (1.000 against a
   median 1.133), min 1.070 (mean 1.133 -> 1.138); float32 code requests with 200-token prompts after chat
   (8-ms-a-token catch-up), never a trial before: mean 1.000 -> 1.004 (0.970-1.075 by seed); short-prompt code
   after chat min 0.992 -> 0.981 (mean 1.040 -> 1.039); the other nine scenarios unchanged. At 128 tokens the
   share alone affords those trials (unchanged). A small gain: at 64 tokens a 200-token catch-up is ~8% of the
   request's plain seconds and a win of 1.15x saves ~13%, which rarely clears a margin of 2. On the real pair
   (float32 reading 12) humaneval still ran plain: its own confidences predicted no win worth twice the catch-up.

17. Lean one rung up (:meth:`BudgetController._lean`). A drafted choice c runs, instead of itself, the next candidate
   above it that is at least min(``initial_budget``, :data:`LEAN_FLOOR` = 8) (from 5, 8: the rung 6 adds a draft
   forward for one node and would stop a climb), while that rung's trusted rate is within ``lean_margin`` (3%; 1%
   since design 22) of c's, or, untrusted, while its optimistic rate is not dominated (design 3b) and trials have
   not lost their exploration
   share (design 8; an untrusted rung's steps count their loss against c's rate there, as a trial's do); only once c
   ran a drafted step in this sequence or the last (design 11b), and only when both c and a trusted rung pass the
   catch-up test of designs 6 and 14 (an untrusted rung is judged as c). A lean step pushes the trial schedule back
   by the interval: the lean is the probe. Every step at the rung informs c and
   every budget below, paired on the same steps, so the choice's neighbours are measured all the time instead of by
   2-step trials spaced 4-64 steps apart; when the rung wins it becomes the choice and the next rung is leaned to (a
   climb); when it is clearly worse, c runs itself and the scheduled trials probe that rung, not 2 x c (design 10).
   Where verification is flat (bf16 on the Intel Xeon, docs/BENCHMARKS.md section 5, sweep 12) the rate is flat to
   2-3% around the best N while the estimates are noisier than that: a choice left on a lost 2-step trial of 16 sat
   at N = 8 for 20 steps of chat, and trials of 2 x c (32-64 nodes on code, about one draft forward per accepted
   token) were 90 of 645 steps. Measured in ``scripts/controller_scenarios.py``'s real-pair-like Intel bf16 worlds
   (easy and hard stretches fitted to sweep 12's per-step acceptance at N = 8 / 16 / 24; 8 seeds, 5 code then 5 chat
   requests of 128 tokens, auto over the best fixed N of the block, min / median / mean): code 0.880 / 0.970 / 0.954
   -> 0.939 / 0.966 / 0.963, chat 0.886 / 0.917 / 0.922 -> 0.920 / 0.971 / 0.977; with the product's initial budget
   of 16 (16 seeds, median) code 0.942 -> 0.957 and chat 0.961 -> 0.977. A fixed N = 12, the best single N in those
   worlds, reads a median 0.989 (code) and 1.000 (chat) of the best fixed N by the same measure, N = 16 1.000 and
   0.975: the rest is what learning costs against a choice made knowing the text. Leaning one rung without the floor
   of 8, chat fell to N = 4-5 for 100+ steps (0.944); probing 2 x c beside the lean, code lost 3-9% of a block to
   3-step trials of 40-48 nodes (0.944). The float32 and EPYC bf16 scenarios moved by -0.7% to +1.4% in median
   (float32 code 1.133 -> 1.126, float32 chat -> code: code 1.034 -> 1.048). Tried and not adopted in the same
   worlds: a longer memory (half-life and window 64: code 0.967, chat 0.956-0.964), a hysteresis of 1-4% on every
   change of choice, a margin of 2%, 5% or 8%, 3-step trials: all within the seeds' noise of about 1-2%.

18. Below the initial budget, lean twice as far (:meth:`BudgetController._lean_rung`). A drafted choice c below
   ``initial_budget`` leans to the first candidate >= min(``initial_budget``, max(:data:`LEAN_FLOOR`, ``lean_reach`` x c))
   (``lean_reach`` 2: from 8 to 16, from 10 or 12 to 16, from 4 to 8) instead of the next rung; at and above the initial
   budget the lean is design 17's. Steps inform only the budgets at or below their own (the prefix property), so a
   choice that fell on a noisy stretch no longer measures the budgets it left: on the real pair's recorded trees
   (``scripts/replay_positions.py``, exact acceptance at every position of sweep 13's answers) the first mt_bench
   answer of a fresh controller fell 16 -> 8 -> 4 within 11 steps, on chained estimates of 12 and 16 from their
   first 3 samples, and ran 50 steps at N = 4 (6.12 tok/s against 6.90 for a fixed N = 16); the next rung above 8
   (10) says nothing of 16, and 16's rate, once trusted on 3 samples, was never measured again. The estimates
   themselves are nearly unbiased there: a fixed N = 32 run's steps predict every smaller budget's rate within
   2-4% of that budget's own run on mt_bench, so the loss is sampling noise and the one-way flow of information,
   not a biased estimator. Measured in that replay (35 prompt turns, 32 timing-noise seeds, auto over the best of
   the sweep's fixed N = 8 / 16 / 24 per dataset, mean): mt_bench 0.972 -> 0.983, qa 0.969 -> 0.980, humaneval
   0.995 -> 0.997, alpaca 0.990 -> 0.985, gsm8k 0.981 -> 0.978, sum 0.975 -> 0.969, all 0.983 -> 0.986: a gain where
   the choice falls below 16 (chat), level within the seeds' noise (~0.5%) elsewhere. ``scripts/controller_scenarios.py``
   is unchanged at the default ``initial_budget`` of 8 and level with 16 (real-pair-like code 0.958 -> 0.957, chat
   0.956 -> 0.957, median of 8 seeds). Tried in the same replay and within that noise: a lean margin of 5%, a carried
   weight of 4, min_steps 4, a half-life of 48; not adopted: leaning to twice the choice above the initial budget too
   (code would lean to 48-64 nodes: -1.7% on code in the synthetic worlds), the largest budget a one-standard-error
   bound on the paired ratio does not rule out (mt_bench +1.5%, qa -7%: chat's per-step variance keeps 32-node trees
   in reach), and moving the choice down only on such evidence (chat ratchets up to 32 and carries it into qa).

19. The initial budget is an anchor left only on evidence (:meth:`BudgetController._admitted`). A drafted candidate
   other than ``initial_budget`` (the product's default, 16, or a tuned profile's N) may be chosen only while, below
   the anchor, its rate beats the anchor's by more than :data:`ANCHOR_GAP` (10%), or its paired rate, on the steps
   that inform both, beats the anchor's by more than ``anchor_z`` (1) standard errors
   (:meth:`BudgetController._paired_z`, the delta method on the two ratios of sums); plain decoding is always admitted (its rate comes from the costs), and while the
   anchor is untrusted every candidate is. Where the rate is flat around the anchor (bf16 on the Intel Xeon: every
   fixed N from 12 to 32 within 3% of the best per dataset) the estimates move the choice on noise: a 3-sample
   stretch took mt_bench from 16 to 8, a lucky one took sum to 32 for a request, and each such move costs 3-5% of a
   request. An anchor cannot do worse than the anchor's own rate by more than about one standard error of the
   difference while it holds, and where the anchor is wrong by a wide margin (float32: 16 nodes verify at 2-3x one
   token) the gap admits the smaller budgets at once: every step at the anchor measures them, paired. Above the anchor
   only the paired test admits: those rates come from a few lean and trial steps, chained, and in a first sweep
   with the gap on both sides mt_bench's predictable second turns took 40-48-node trees on it and carried them into
   the next request (19.9 s against 17.2 s at N = 16). The test counts weights as steps (carried samples capped at
   ``carried_weight``, aged ones: less evidence); with squared weights the cap cancelled, and in sweep 15
   (docs/BENCHMARKS.md section 5) humaneval's 32-node choice passed the test all through sum's first request and qa.
   Measured on the recorded trees of sweep 13 (``scripts/replay_positions.py --seeds 32``, auto over the best of
   N = 8 / 16 / 24, mean / worst seed; design 18 -> 19): mt_bench 0.983 / 0.949 -> 0.988 / 0.975, alpaca 0.985 /
   0.881 -> 0.985 / 0.970, gsm8k 0.978 / 0.945 -> 0.997 / 0.981, humaneval 0.997 / 0.932 -> 0.995 / 0.984, sum 0.969 /
   0.932 -> 0.993 / 0.975, qa 0.980 / 0.931 -> 1.005 / 0.953, all 0.986 / 0.970 -> 0.995 / 0.991.
   ``scripts/controller_scenarios.py --set initial_budget=16`` (the product's anchor; median of 16 seeds): bf16 level
   (real-pair-like chat 0.957 -> 0.964 of the best fixed N), float32 code, where the anchor is the wrong budget, 1-2%
   lower and still above plain (1.107 -> 1.096 of plain; 200-token prompts 1.059 -> 1.026). Tried: anchor_z 2 or 3
   (float32 code 1.103 -> 1.080 of plain: a wrong anchor holds too long), no gap (Intel float32 code mean 1.183 ->
   1.158), a gap of 5% (replay level); keeping the current choice (not the initial budget) until a candidate beats it
   by z standard errors: qa 0.980 -> 0.941, the carried choice of the dataset before held.

20. The gap waits for the anchor's evidence (``anchor_gap_steps``, 8). Below the anchor, the 10% gap of design 19
   admits a candidate only once the anchor has 8 samples (steps at it or above it), or while the anchor is no faster
   than plain decoding (a wrong anchor: then the gap acts at once, and a choice of plain, which no longer measures
   the anchor, cannot hold it back). In sweeps 16 and 17 a fresh controller's first mt_bench answer read N = 8 as
   10-17% faster after 3-4 steps at 16 and ran it for most of the answer, 7% slower than N = 16 there (a step at 8
   no longer measures 16, so the estimate stays until a trial). Replay of sweep 13's trees: unchanged (its first
   answer's early steps do not show the effect); ``controller_scenarios.py --set initial_budget=16``: level within
   1% (float32 code, 200-token prompts 1.026 -> 1.035 of plain; float32 chat -> code, code 1.013 -> 1.001; Intel
   float32 code 1.193 -> 1.194). Tried first: the sample count alone (no plain clause): Intel float32 code fell
   from 1.19 to 1.00 of plain, since plain, once chosen, never measured the anchor again and the gap stayed shut.

21. Verify costs are re-measured where the choice is made (``cost_refresh_interval``, 16;
   :meth:`BudgetController._refresh_due`). A tree size measured only during a slow spell of the machine kept that
   cost for good once the controller moved away from it: on the 2-core Xeon, verify steps run in spells 20-40%
   slower for 5-10 steps (and single steps 2x), and in a traced mt_bench answer (docs/BENCHMARKS.md section 5) a
   fresh controller measured N = 16 in such a spell (297-326 ms against 240 ms later), then leaned to 20 and 24 and
   never verified 16 again; the curves are carried, so that held for every later answer. Now, at most once every
   16 steps, the candidate just below a drafted choice or the choice itself (whichever ran longer ago: the choice
   while the controller leans above it or after catch-up skips) runs one step once 16 or more steps ran after its
   last one (not charged to the exploration share, like plain-measure steps); and the verify curve fits each size
   from its samples of the last 32 steps (at least its newest :data:`RECENT_SAMPLES` = 3), so a spell's samples
   leave the fit after three refreshes. Synthetic worlds (tests/test_control.py, i.i.d. noise): flat verification 0.984 -> 0.987 of the best fixed N; on an acceptance
   drop the budget before the drop 10.9 -> 15.2 (it is 16 and more in that world). Replay of sweep 13's trees
   (i.i.d. noise, so a refresh only costs): all 0.995 -> 0.994, alpaca 0.985 -> 0.971 (mean of 32 seeds), within
   the seeds' spread elsewhere. Tried first: refreshing the rung below and the choice each every 16 steps (two
   steps in 16: flat verification 0.967), and leaving a size without recent samples out of the fit (a single fresh
   sample then set its cost; with only the running sizes fresh, the curve below them went flat: 16 cost as much as
   24, the lean bias again).

22. A lean margin of 1% (``lean_margin``, was 3%). In every real bf16 sweep on the Xeon (16, 17, and 18's first five
   mt_bench turns, design 21) auto leaned from 16 to 20 on most chat steps and lost 3-8% per answer to N = 16
   (sweep 18's first turn: 20 nodes accepted 3.54 tokens a step against 16's 3.31, +7%, for 0.46 more draft
   forwards of about 104 ms and 15 ms more verify, +11% a step: 20 is 3-4% slower, inside the 3% margin within
   the estimates' noise). With 1% the lean stops where the rung above is measurably slower, and still runs where it
   is level or faster (code climbs to 24-32 as before). ``python scripts/controller_scenarios.py --seeds 48 --set
   initial_budget=16`` with ``--set lean_margin=0.03`` for design 21: Intel bf16 real-pair-like code 0.952 -> 0.960
   of the best fixed N, chat 0.961 -> 0.972 (with slow spells 0.949 -> 0.961 and 0.961 -> 0.957), float32 code
   1.111 -> 1.115 of plain (200-token prompts 1.037 -> 1.056), the rest level. Replay of sweep 13's trees
   (``--seeds 32``): all 0.994 either way (mt_bench 0.988 -> 0.991, alpaca 0.976 -> 0.974, humaneval 0.995 ->
   0.992); a margin of 0 loses there (all 0.990, qa 0.988: the rung above is then rarely measured).

23. What a float32 run needs to leave plain decoding (a fresh look at the hostile reading, docs/BENCHMARKS.md section
   5). On the Xeon in float32 the bench's first step (16 nodes) was the run's only drafted step: every later step
   was plain and every trial was refused, on code too, where a fresh controller gains 1.49x. Three estimates were
   wrong, each from too little data, and plain decoding never gathers more: (a) the catch-up curve, measured once
   at a 64-token bucket, was flat below it, so the one token of a plain step was charged as a whole prompt (0.4-1.6
   s): now a catch-up below the smallest bucket measured costs in proportion to its tokens; (b) the first draft
   forward of that step carried the prompt, so it was left out of the width table and draft(1) was read off the
   width-4 forward (0.23 s against 0.11 s): now the drafter runs a prompt's catch-up as a forward of its own
   (:meth:`talon_sd.drafters.Drafter.catch_up`; a draft LM's prefill ran apart anyway, so it costs nothing) and the
   loop times it apart (``StepRecord.catch_up_seconds``), which also gives the catch-up curve exact samples; (c) the
   predicted rate of design 12 took each probe's tree shape from steps drafted on other text (chat: 2 forwards where
   code runs 8): now those steps are blended with a chain estimate, a chain of one-node forwards that holds the
   next token as often as the draft's top-1 child did at that confidence (:class:`Predictability`, ``top``), weighted
   as :data:`SHAPE_PRIOR_STEPS` (1) step, so old steps from other text count for little. In tests/test_control.py's
   float32 worlds: chat then code with 200-token prompts, 1.007 -> 1.031 of plain (6 of 8 seeds draft on code, 2
   before); design 12's chat/code test 0.982 / 1.029 -> 0.986 / 1.042 of plain. Tried first: the chain bound of
   the tree's own follow (not the top-1's), alone or as the larger of the two: code 1.08 but chat 0.957-0.964 of
   plain (it promised chat trees that never came).

24. No exploration near a sequence's end (``explore_min_tokens``, 32). Trials, lean steps and cost refreshes run only
   while the sequence is expected to commit at least 32 more tokens (design 9's estimate, capped by the tokens
   left): what they learn is used over the rest of the request, and a 3-10-step QA answer cannot repay a 2-step
   trial of a larger tree (qa, sweep 19: 0.89 of the best fixed N, trials and leans on a fifth of its steps). A
   due trial waits ("trial-short") and starts in the next long sequence. Replay of sweep 13's trees
   (``--seeds 32``, mean, 0 -> 32): qa 1.004 -> 1.015 of the best of N = 8 / 16 / 24, mt_bench 0.991 -> 0.995,
   humaneval 0.990 -> 0.996, alpaca 0.967 -> 0.963, all 0.993 -> 0.996; ``controller_scenarios.py --seeds 48 --set
   initial_budget=16``: medians level (real-pair-like chat 0.972 either way, code 0.960 -> 0.966), the worst chat
   seed lower (0.918 -> 0.857). 16 and 24 read alike.

25. A large catch-up waits for the new text's own confidences. Design 14 let a carried drafted choice pay the draft's
   catch-up over a new prompt at once when the last sequences' rate paid it back twice over; after code that rate is
   high, and the float32 reading at temperature 1 (docs/BENCHMARKS.md section 5) paid a 700-token prompt's catch-up
   (about 3.5 s) on sum, whose text drafts poorly: 0.93x of ar over 64 tokens. A catch-up above ``trial_cost_share``
   of the rest's plain seconds (what a trial may spend) now also waits for :data:`OWN_CONFIDENCES` of the sequence's
   own target confidences, whose predicted rate then bounds the carried one. In bf16 on the Xeon a prompt's catch-up
   stays under that share, so this does not act there. tests/test_control.py: code, then news with a 700-token
   prompt: the first 4 steps plain, then at least 0.97 of plain decoding.

26. A catch-up costs at most ``tokens`` more rows of a draft forward (:meth:`BudgetController._catch_up_seconds`). The
   catch-up curve is sampled only when a catch-up is paid, and its first sample is the draft's first forward of the
   process (cold); in the float32 bench after design 25 that one sample (from the 8-token warm-up) kept every trial
   of all requests blocked ("trial-catch-up" from the first step on). The width curve, measured every drafted step
   and extrapolated linearly past its widest forward, bounds it, draft(tokens + 1) - draft(1), for catch-ups up to
   4x the widest forward measured (further out the extrapolation is a guess: in tests/test_control.py's bf16 world
   it priced a 700-token prompt at 0.6-1.0 s against 1.4 s, and 12-token answers paid it).

27. A new command starts from plain decoding unless drafting clearly paid (:meth:`BudgetController.for_new_command`).
   The controller memory (:mod:`talon_sd.controller_memory`) hands one command's controllers to the next process,
   whose prompt is another: on the AVX2 EPYC in float32 a code answer ended on a 12-node choice that read about
   plain decoding's rate, and the next command, a chat question, ran 7 drafted steps of that choice (trials, a
   cost refresh, the choice, a lean) before its own steps brought it down: 0.87x of ``--tree ar``. When the carried
   best drafted rate beats plain decoding by less than :data:`NEW_COMMAND_MARGIN` (how much acceptance differs
   between prompts, code against chat, is more than that), the new command keeps what the machine costs (cost
   curves, catch-up curve, calibration, predictability, finished lengths, exploration bookkeeping) and drops the
   acceptance samples and the last text's target confidences: its choice is plain decoding, trials from plain
   (design 12's predictions from its own text) find what its text affords, and the probe interval starts over.
   Where drafting won clearly (bf16 on the Xeon: 1.3-1.8x) the carried choice is kept, as between the requests
   of one process. A trial predicted from the text waits for a full ``confidence_window`` of it (a new command's
   first token had predicted a win on chat). tests/test_control.py, this CPU's curves: chat after code 1.00x of
   plain decoding (carried: 0.97x); fresh processes (docs/BENCHMARKS.md section 5, bracketed): 0.99x of ``ar``.

28. A clear win to leave plain decoding, and a bet judged on the whole text (``leave_plain_margin``, 5%;
   ``bet_window``, 64; ``bet_margin``, 1.5). On the AVX2 EPYC in float32 a drafted step costs 2-5 plain steps, and
   trees there beat plain decoding by a few percent outside code: (a) from plain decoding, a drafted candidate
   becomes the choice only when its rate beats plain decoding's by more than 5% (a few percent is within the noise of
   a handful of steps, and each switch pays the steps that show it was not): sweep 13's replay on that CPU's costs (8
   seeds), qa 0.906 -> 0.933 of plain decoding, its worst seed 0.888 -> 0.920, the other datasets within 0.01, bf16
   on the Xeon unchanged (it never chooses plain decoding). (b) A catch-up judged on the sequence's own text (designs
   14, 25) read the rate predicted from the last ``confidence_window`` (16) confidences; on sum at temperature 1
   (``scripts/trace_steps.py auto:humaneval:0 auto:sum:0 --temperature 1``) that prediction rose from 1.0 to 2.1
   tok/s over 15 confident tokens 60 tokens in, the 6.6 s catch-up of a 764-token context was paid for a saving of
   7.6 s, and the 4 drafted steps that followed ran at 1.1 tok/s against plain decoding's 1.8. The rest of a sequence
   is now judged on up to 64 of its own tokens. (c) Such a bet (a catch-up above a trial's share) is paid only when
   the predicted saving is 1.5 times its cost (``bet_margin``): that bet was predicted to repay 1.16 times, and the
   catch-up estimate itself was 25% low in the trace's first run (6.1 s against 8.1 s). The replay is neutral (sum
   1.039 -> 1.044, the rest within 0.002; bf16 unchanged); a bf16 world of tests/test_control.py where 36-token
   answers repay a 1.4 s catch-up goes from 1.15x to 1.10x of plain decoding (twice over: 1.00x, so not 2). Tried and
   left out: a carried choice that beats plain decoding by less than 1.25x or 1.5x waiting for the new sequence's own
   confidences (qa 0.931 / 0.928 on the EPYC's costs, bf16 qa 1.019 -> 1.006 / 0.944): qa's first answer after the
   sums drafts on a carried rate that the last sum earned, which nothing before its own steps can refute.

29. A prompt's agreement as a prior (``prompt_prior_width``, 0.05; :meth:`BudgetController.observe_prompt`). A
   short answer after long, well-drafting ones lost on its first 1-3 drafted steps, taken on the carried samples of
   the last text (design 28's closing note): nothing of its own refutes them before those steps. Its prompt does:
   the share of prompt positions where the draft's argmax equals the target's has Spearman 0.81 with N = 16's speed
   over plain decoding across sweep 13's 30 first-turn prompts (qa 0.44-0.49, sum 0.56-0.60, humaneval 0.75-0.81;
   ``scripts/prompt_agreement.py``; over 64 positions spread over the prompt, what the loop measures, 0.68). Where
   the first step would draft (:meth:`prompt_agreement_due` asks :meth:`next_budget` of a copy), the decoding loop
   measures it before that step (both output heads over those 64 rows only; the draft forwards its prompt then, as
   that first step would have), and the controller compares it with the earlier sequences of this process (and of
   the controller memory): each one that was told its agreement and committed at least :data:`PRIOR_MIN_TOKENS`
   from drafted steps left a pair (agreement, its drafted steps' tokens/s over plain decoding's modelled rate).
   When at least :data:`PRIOR_NEIGHBOURS` earlier prompts within ``prompt_prior_width`` of this one drafted, on
   average, slower than plain decoding, the carried acceptance samples and the last text's confidences are dropped,
   the choice is plain decoding and no scheduled probe runs at once: the sequence drafts once its own text predicts
   a win (design 12) or at the schedule's next trial. The speed is measured on this machine, so a prompt kind
   starts plain where drafting lost (the AVX2 EPYC in float32) and keeps drafting where it paid (bf16 on the Xeon:
   never started plain in the replay); design 32 says which sequences pay the heads. Sweep 13 replayed (8 seeds,
   the heads charged at 4 ms a position on the EPYC, 1 ms on the Xeon): float32 on the EPYC, qa 0.934 -> 0.967 of the best fixed budget (plain
   included), alpaca 0.991 -> 1.003, all 0.993 -> 0.998, sum unchanged (0.941); bf16 on the Xeon within 0.003 on
   every dataset (all 0.997 -> 0.996). Tried and left out: a least-squares line from agreement to speed through all
   pairs (sum 0.941 -> 0.926, it started sum prompts plain on qa's evidence); the agreement over every prompt
   position (its heads cost 2.8 s on a 700-token sum prompt there); asking whenever a trial was due (it paid long
   prompts' catch-ups that the controller would have declined).

30. A prompt far below the evidence (``prompt_gap``, 0.15; :data:`FAR_VERIFY_RATIO`). Design 29 acts only once two
   earlier prompts near this one lost; the first chat answer after code has none and drafted on code's carried
   samples: in a timed float32 run on the EPYC (humaneval then qa) the first qa answer ran three trees of 20-24 nodes
   that accepted little, 0.69x of plain decoding, and qa as a whole 0.86x. Its prompt said so beforehand: the draft
   agreed with the target on 47% of it against 75-80% on the code prompts whose answers left the samples. When the
   new prompt's agreement lies more than ``prompt_gap`` below that of the last sequence that taught the prior (the
   source of the carried samples, unless later ones drafted without being measured), too few earlier prompts are
   near it for design 29 to judge and none of those drafted at least as fast as plain decoding, and verifying the
   first step's tree (the carried choice, or the first probe's size from plain) costs at least
   :data:`FAR_VERIFY_RATIO` plain verifies (1.5; 1.75 since design 34) (on the EPYC in float32 1.8x at 4 nodes, 2.9x at 32; bf16 on the Xeon
   1.0-1.15x, the H200 1.05-1.2x), the sequence starts as design 29's losing neighbours make it start:
   plain, the carried samples and the last text's confidences dropped, and so are the lengths of the last answers
   (design 9's estimate of the tokens left, which let the second qa answer run a trial that lost 10%: code's
   answers ran to the token limit). Where verification is flat a wrong tree costs little beside what the carried
   samples win: without the steepness condition the rule cost bf16's qa after humaneval 0.978 -> 0.919 and sum
   0.993 -> 0.971 of the best fixed budget. Sweep 13 replayed on the EPYC's float32 costs (8 seeds, the heads
   charged at 9 ms a position as measured there, ``scripts/replay_positions.py --order``), over plain decoding: qa
   right after humaneval 0.931 -> 0.967, after gsm8k 0.936 -> 0.988, mt_bench after humaneval 1.117 -> 1.127, sum
   after humaneval 1.037 unchanged, alpaca after humaneval 0.997 unchanged and after gsm8k 0.996 -> 0.974 (its first
   answer gains, the second, 20 tokens, runs a scheduled trial it did not run before); the sweep's own order, and
   every order on the bf16 and H200 costs, unchanged. ``prompt_prior_width`` = 0 turns design 30 off with design 29.

32. The heads where an agreement can change the start (:meth:`_prior_can_start_plain`; 31, a lower anchor, was tried
   and reverted: docs/BENCHMARKS.md section 5). Design 29 asked every
   sequence for its agreement until 8 measured prompts had all drafted faster than plain decoding. On the EPYC with
   AVX512-BF16 the two output heads cost 2 ms a prompt row (target 0.9-1.7, draft 0.7-1.0: ``prefill_logits``
   against ``prefill``), 0.08 s on a 39-token QA prompt, 4% of its 17-token answer, and there no agreement could
   have started a sequence plain: no measured prompt had lost, and the first step's tree verifies at under
   :data:`FAR_VERIFY_RATIO` plain verifies, so neither design 29's losing neighbours nor design 30 can act. Now a
   sequence pays the heads when an agreement could change its start (the measured prompts near some agreement drafted,
   on average, slower than plain decoding, or the first tree verifies at :data:`FAR_VERIFY_RATIO` or more), and otherwise only every
   :data:`PRIOR_SAMPLE_EVERY`-th sequence, from the first on, so that pairs still gather for when the machine or the
   text turns; a lone loss among faster neighbours cannot start a prompt plain and does not count. Sweep 13 replayed
   (8 seeds; the EPYC's heads now charged at the 2 ms measured): bf16 on the EPYC,
   mt_bench 0.981 -> 0.985 and alpaca 0.958 -> 0.962 of the best of N = 8, 12, 16, all 0.983 -> 0.985; the Xeon
   0.996 -> 0.997; the AVX2 EPYC in float32 unchanged on every dataset (its verify curve is steep: every sequence
   still measures). Tried and left out: measuring only once a pair exists that some agreement could act on (design
   30 needs one): on the float32 costs qa 0.962 -> 0.987 of plain decoding but alpaca 1.001 -> 0.991 and humaneval
   1.529 -> 1.516, as the first sequences of a fresh process then taught the prior nothing.

33. Verify costs by context (:meth:`CostCurve.read_at`, ``StepRecord.context_tokens``, ``next_budget``'s
   ``context_tokens``). A tree's verify attends to every cached token, so its cost grows with the context: on the EPYC
   with AVX512-BF16 in bf16 the fixed budgets' steps of two sweeps took a median 179-188 ms at 16 nodes over contexts
   under 150 tokens and 191-209 ms over 600 or more (8 nodes 140-154 / 154-171 ms; a plain step no dearer), about
   2 us a node per context token; one trace read 0.157-0.164 s at 16 nodes over a QA prompt against 0.21 s over a
   summary. The curve kept each size's last samples whatever context they came from, so after the summaries the sizes a
   QA answer did not run again kept their long-context costs while the ones it ran were measured cheap, and the
   relative costs that choose N were off for the whole of the short answers. The loop now tells the controller the
   target's cache length at each step; the verify curve estimates a context slope (Theil-Sen over pairs of samples of
   one size of at least :data:`CONTEXT_MIN_SIZE` nodes whose contexts lie at least :data:`CONTEXT_MIN_SPAN`
   node-tokens apart) and, read at the coming step's context (re-read once it moved :data:`CONTEXT_STEP_TOKENS` tokens
   or a tenth), moves every sample there. Where a context costs nothing the pairs differ by timing noise, and one
   noisy sample at another context tips many pairs at once: the slope is used only with :data:`CONTEXT_MIN_PAIRS`
   pairs, :data:`CONTEXT_AGREEING` of them finding the longer context dearer, and a difference over the upper
   quartile of their spans of at least :data:`CONTEXT_MIN_EFFECT` of their seconds. Sweep 13 replayed with the EPYC's
   costs made context-dependent (2 us a node per token about forward_costs' 200-token cache; 24 seeds;
   ``scripts/replay_positions.py --blind-context`` for before): the sweep's order all 0.981 -> 0.982 of the best of
   N = 8, 12, 16, qa 0.949 -> 0.989 (mean 0.955 -> 0.975), the other datasets within 0.007; sum then qa, qa 0.956 ->
   0.978. At 4.5 us (``--context-slope 4.5e-6``) all 0.982 -> 0.984, alpaca 0.960 -> 0.966, gsm8k 0.973 -> 0.981, sum
   then qa's qa 0.942 -> 0.968. The replays without a context cost (the Xeon's, the AVX2 EPYC's float32) are unchanged
   but one Xeon qa (1.015 -> 1.011): the guards hold the slope at 0 there. Without the last two guards the estimate
   found a context cost in float32 timing noise and cost alpaca 0.9% there and 0.8% on the Xeon.

34. Design 30's steepness read where the first step runs (``prompt_agreement_due`` and ``observe_prompt`` take the
   first step's ``context_tokens``; :data:`FAR_VERIFY_RATIO` 1.75, was 1.5). Design 30 asked whether the first tree
   verifies at 1.5 plain verifies or more with the verify curve still read where the last sequence ended (design 33):
   after a 918-token summary prompt and its 128-token answer, the next summary (a 422-token prompt whose agreement, 0.39,
   lay 0.3 below the last measured one) read 16-20 nodes at about 1.6 plain verifies, started plain (16 plain steps, then
   a climb from a trial of 4) on the EPYC with AVX512-BF16, where N = 8-16 ran it at 1.7-1.9x plain decoding (timed
   ``--repeats 3`` run, docs/BENCHMARKS.md section 5: 12.7 s against 11.1-11.8 s at a fixed N), and the climb's leans
   carried into the first QA answer, which opened at 24 nodes and leaned to 32 (4.05 s against 3.09 at N = 12). The
   costs are now read at the new prompt's context, and the ratio is 1.75: bf16 on that EPYC verifies 16 nodes at 1.25-1.4
   plain verifies and 32 at 1.6 over short contexts, float32 on the AVX2 EPYC 4 nodes at 1.8 and 16 at 2.2 (the rule's
   case), the Xeon and the H200 under 1.2. Replays (16 seeds, median): sum then qa on the EPYC's bf16 costs qa 0.914 ->
   0.917 (at 4.5 us a node per context token 0.918 -> 0.925), sweep 13's order 0.984 -> 0.985, the AVX2 EPYC's float32
   orders (humaneval then qa or sum, all) unchanged. Tried in the same replays and left out: keeping a carried choice
   above the anchor, or a lean above it, out of a new sequence until its first 1-3 drafted steps (sum then qa, qa 0.917 ->
   0.928-0.942; sweep 13's alpaca 0.967 -> 0.958-0.963 on the EPYC, 0.972 -> 0.934-0.968 on the Xeon); and a second
   condition on a 4-node tree's verify (it is interpolated where small trees never ran: the AVX2 humaneval then qa fell
   0.967 -> 0.939).

35. The prompt sample backs off (:data:`PRIOR_SAMPLE_MAX`, 32). Design 32's every-4th sample is a cost where no agreement
   can change a start: in sweep 25 (bf16 on the EPYC with AVX512-BF16, docs/BENCHMARKS.md section 5) a measured QA or
   Alpaca prompt of 36-43 tokens took 0.38 s before its first step against 0.22-0.23 s for the fixed budgets (about
   0.05 s of it the draft's prompt forward, which the first step would have run), 5-7% of a 17-20-token answer, on a
   fifth of those requests; in a server it would be a quarter of all requests for as long as it runs. Samples are now
   counted from the last measured prompt, and each one whose sequence then drafted at :data:`NEW_COMMAND_MARGIN` x
   plain decoding or more doubles the interval to the next (4, 8, 16, then 32 sequences: 0, 4, 12, 28, 60, 92); one
   that drafted slower sets it back to 4, and where an agreement could act (losing neighbours, a steep first tree)
   every sequence is measured as before. Replays (16 seeds, median; ``scripts/replay_positions.py``): sweep 13 on the
   EPYC's bf16 costs all 0.985 -> 0.986 of the best of N = 8, 12, 16 (qa 0.996 -> 1.004, humaneval 1.010 -> 1.013,
   gsm8k 0.977 -> 0.979, the rest within 0.002), the Xeon's all 0.996 -> 0.997, the AVX2 EPYC's float32 unchanged (its
   verify is steep: every sequence measures); the two 10-15-sequence worlds of sweep 24 unchanged (only their 8th
   sequence is spared). Never sampling there read all 0.987: the back-off keeps most of that while pairs still gather.

(36, tried and reverted, docs/BENCHMARKS.md section 5: where 16 nodes verified at 1.15-1.75 plain verifies, the rung
below the anchor admitted as an anchor too. The replays of this CPU's own texts gained (sum then qa, qa 0.917 ->
0.968; the tree texts 0.962 -> 0.974), but a timed sweep read 0.965 of the best fixed N overall (sweeps 23-25: 0.981-
0.988): its choices moved from 16 to 12 on code and chat, where N = 16 was that run's best column, as with design 31;
a timed sum-then-qa run read qa 0.922 but sum 0.939, where design 34 read 0.877 and 0.991 pooled over two runs.)

38. A measured prompt's draft forward is a catch-up sample (:meth:`BudgetController.observe_catch_up`). Measuring a
   prompt's agreement (design 29) forwards the prompt through the draft LM before the first step, which then has
   nothing to catch up; where verification is steep every prompt is measured (design 30 could act), so a run of code
   requests that drafted from their first step on taught the catch-up curve only the few tokens of plain steps,
   which a CPU forwards at about the cost of one row. Read from those, a 700-token news prompt's catch-up cost about
   nothing: at temperature 1 on the AVX2-only EPYC in float32 (docs/BENCHMARKS.md section 5, medians of three runs)
   the first CNN/DM request after five HumanEval ones would draft on code's carried choice, so its prompt was
   measured (the draft's forward over 709 tokens, about 5 s), it started plain all the same, and it read 0.85x of
   ``ar``. The loop now reports that forward's seconds; the curve then charges a long prompt what the measured prompts
   cost per token, and the first step waits for the new text's own confidences (design 25) with nothing measured.
   tests/test_control.py: code with every prompt measured, then a 700-token prompt: measured before, plain and
   unmeasured now. Timed since (the same bench): that request 0.99x, sum 0.80x -> 0.98x, every sum step plain.

40. That sample is the decoder stack alone (:func:`talon_sd.decoding._prefill`; the loop, not this module). Design 38
   timed the draft's prompt forward together with its output head over the (up to 64) agreement rows, which a step's
   catch-up never runs; on the AVX2-only EPYC in float32 the head over 50 rows of a 151,936-token vocabulary added
   half to nine tenths of the 50-token forward's 0.35 s (0.51-0.67 s in all), and the curve, linear past its largest
   bucket, carried that into every longer catch-up: HumanEval's 166-token prompt after two chat requests was charged
   2.2 s at its first step (3.3 s without the bench's warm-up; its forward: 0.96 s), above what a trial may spend,
   and every step of the code request ran plain ("trial-catch-up"). The loop now runs the drafter's catch-up (:meth:`talon_sd.drafters.Drafter.catch_up`, timed
   as a step's) and then asks for the logits at the agreement rows from that forward's kept output (on CUDA the
   decoder-stack prefill now waits for the device, so a step's catch-up is timed apart there too). A trace of the
   bench's order (8-token warm-up, mt_bench 0, alpaca 0, then HumanEval 1 and 2): the sample 0.38 s for 50 tokens
   (0.67 s before), HumanEval 1 drafted 114 forwards in 31.4 s where it had run plain in 41-48 s. Timed
   (docs/BENCHMARKS.md section 5, six datasets greedy in the bench's order): humaneval 0.98x -> 1.18x of ``ar``, but
   gsm8k 1.04x -> 0.85x: trials reach it too, its drafting is about break-even on that host, and a plain rate measured
   in a slow spell, re-measured only every 64 steps (design 13), kept its requests drafting; not yet addressed.

42. Plain decoding's cost at the drafted steps' host speed (``paired_plain``; :class:`CostCurve`'s ``paired`` size). Every
   drafted rate is judged against rate(1), and while a drafted budget is the choice verify(1) is measured once in 64
   steps (design 13), so its fit reads its newest 3 samples (design 21), up to 192 steps old, beside drafted sizes
   measured in the last 32. The machine runs in spells (on the AVX2-only EPYC a plain step took 0.23-0.39 s within
   minutes): in the float32 bench of design 40 gsm8k's plain rate fell from 3.5-3.8 to 2.92 tok/s in a slow spell and
   stayed there while drafted steps of a fast spell read 3.6-3.7, and gsm8k, about break-even there, drafted at 0.85x
   of ``ar``. Each plain sample now keeps the drafted verify samples added within :data:`PAIR_STEPS` (4) steps before
   and after it; while fewer than :data:`RECENT_SAMPLES` plain samples lie within the verify curve's horizon, verify(1)
   is the median over its newest :data:`PAIRED_KEPT` (9) samples with :data:`PAIR_MIN` (2) such neighbours of (its
   seconds) x (the median over its neighbours of the drafted sizes' fit at the neighbour's size / the neighbour's
   seconds), moved to the read context (design 33), weighed in the fit as the samples it replaces: the same machine
   speed on both sides of the comparison. Where plain steps are frequent (a plain choice) they are fitted as measured:
   a first version that always paired read verify(1) from the few samples beside trials and was noisier there (three
   seeded worlds of tests/test_control.py changed their paths; a 64-step run of exact plain samples was outvoted by
   three paired ones). ``scripts/controller_scenarios.py`` (16 seeds): every scenario within 0.005 of before in median
   but the Intel bf16 chat (0.959 -> 0.964) and its slow-spell code (0.974 -> 0.985). Real pair, float32 on the AVX2-only
   EPYC, ``scripts/ab_controller_settings.py --dtype float32 --dataset gsm8k --limit 5 --set paired_plain=false``
   (both variants side by side, order rotated): the always-paired version 0.999x of ``ar`` against 0.912x without
   pairing in the same run (all plain against 16-20-node trees), this one 0.951x against 1.009x (now the paired side
   drafted and the other went plain); on humaneval (always paired) 1.257x against 1.255x. At break-even which side a
   run lands on is decided by the noise of its first requests, and pairing does not change that. Tried with it and
   left out: while the choice beats plain decoding by less than 1.25x, a plain step every 16 or 8 steps instead of 64
   (design 41 again): within the seeds' noise in break-even float32 worlds with 32-step slow spells.

44. The prompt measure is the draft's mean probability of the target's argmax (:func:`talon_sd.decoding._prefill`; the
   loop, not this module, which takes any agreement in [0, 1]). Design 29's share of equal argmaxes overlapped between
   sweep 13's gsm8k prompts (0.61-0.75) and its HumanEval prompts (0.75-0.80), where drafting lost and won on the
   AVX2-only EPYC in float32, so a code prompt could start plain on math's evidence; the mean probability, read from the
   same 64 rows of the same logits, separates them (0.44-0.51 against 0.61-0.73). Replayed on that host's costs
   (``scripts/replay_positions.py --hardware avx2-fp32-steep --measure soft``, 4 seeds, the bench's order): humaneval
   1.088 -> 1.113 of plain decoding, qa 0.966 -> 0.980, the rest unchanged (all 1.002 -> 1.004); on the older
   ``avx2-fp32`` profile all 0.994 either way (qa 1.062 -> 1.073, gsm8k 0.975 -> 0.971); on bf16 EPYC costs, where
   design 29 never acts, identical. ``prompt_gap`` (design 30) kept at 0.15. Controller memories written with the
   old measure are not read (:data:`talon_sd.controller_memory.MEMORY_FORMAT` 2). Not yet timed on the real pair.

45. A fall starts the trial interval over (``reopen_on_fall``). Trials that lost above a large choice double the
   interval to ``max_probe_interval`` (64 steps); when a poor stretch then pulls the choice down to a smaller drafted
   budget, the probes above it were last measured on the text before the fall, steps at the small choice inform only
   budgets up to it, and the lean (design 17) reads the rung's stale rate, so nothing re-measured the budgets above:
   sweep 28's mt_bench request 84/1 ran N = 3 for 69 of its 70 steps, and replays showed the same (a 70-step turn
   at N = 3, 13% slower than N = 12). Now a fall to a drafted budget sets the interval back to
   ``min_probe_interval`` (a trial from it probes its lean rung, design 17; each trial that loses doubles the interval
   again, and the exploration share of design 8 still bounds their cost). Replays (``scripts/replay_positions.py
   --hardware epyc-bf16 --bar 8,12,16 --fixed 8,12,16 --seeds 16``, auto over the best of N = 8, 12, 16, median):
   sweep 13's texts all 0.987 -> 0.989 (worst seed 0.972 -> 0.985; mt_bench 0.985 -> 0.991, qa 1.000 -> 0.985), the
   sweep-24 tree texts 0.962 -> 0.977 (mt_bench 0.964 -> 0.980), sum then qa 0.977 -> 0.973; the Xeon's bf16 costs
   0.997 -> 0.999, the H200's 0.992 -> 0.994 (24 seeds), the AVX2 EPYC's float32 unchanged (it runs plain). Only
   falls below the lean floor (8): sweep 13 0.988, tree texts 0.973: not kept.

46. A carried drafted choice is checked against a plain step on the new text (``plain_check_steps``). A sequence that
   opens on the last one's drafted choice judges it against rate(1), and while a drafted budget is the choice plain
   steps are rare (design 13), so rate(1) can be a plain cost measured on another text in another spell of the
   machine: on the AVX2-only EPYC in float32 (talon bench, 3 timed runs per turn) mt_bench 82/1 opened on the 16-20
   nodes carried from 81/2, where they had won, and drafted 29 steps at 3.6 tokens a step, about 0.47 s a token,
   against plain steps of 0.37 s on that text: 60.6 s against ``ar``'s 48.2 s, the choice falling only when the
   request was nearly done. The controller's own rates cannot tell this case apart (a stale rate(1) is what makes the
   drafted choice look 1.3-1.5x faster than plain decoding, as a real win looks). So where verification is steep (the
   choice's tree costs :data:`CHECK_VERIFY_RATIO` plain verifies or more, read against the fastest plain sample kept:
   a float32 CPU without AVX512 or with torch's default kernels, where drafting is near break-even and the plain rate
   decides; not bf16 or a GPU, where an unconditional check cost 1-1.5% of short code requests for nothing in the
   synthetic worlds of ``scripts/controller_scenarios.py``), a sequence that opened on a carried drafted choice runs
   one plain step (``plain-check``) after ``plain_check_steps`` of its own drafted steps, unless it ran a plain step
   already. If its drafted steps' measured rate, the catch-up left out, is more than :data:`CHECK_MARGIN` below that
   plain step's, the acceptance samples are dropped (as where design 29 starts a prompt plain; capped to one step's
   weight instead, the few own samples still read a 3-node tree faster than plain and the choice came straight back),
   verify(1) and the plain overhead keep only that newest sample (the older ones were measured elsewhere) and the
   choice is plain decoding, its probe schedule started over: trials and design 12's predictions take it back to
   drafting where this text lets them. A check that finds drafting fast enough changes nothing but one plain step, a
   fresh sample of verify(1). Synthetic worlds on the AVX2 curves: chat after code whose plain steps ran 1.25x slow
   (every drafted N loses more than 10% to plain decoding; 12 seeds) 0.858 -> 0.961 of plain decoding (the check left
   drafting in 8); 48-token code answers at 1.38x plain after code, 16 seeds: a false leave in 1 (after 3 steps with no
   margin 4, with 5% 2, with 10% 0; after 5 steps with 10% 1); the Intel float32 T = 1-like world (drafting 1.1x plain,
   24 seeds) lost 1% in mean after 3 steps and nothing after 5, hence 5 and 10%.

47. A run of own steps that accepted nothing releases the carried samples (design 8's change point, one-sided). Design
   8's z-test reads the carried samples' spread of committed tokens, which is wide where a text drafts well in
   stretches (sum at N = 24 on the real pair: 1 to 15 tokens a step), so a short answer on which the draft is never
   right drafted 3-4 steps at the carried choice before the choice fell: on the AVX2-only EPYC in float32 with the
   int8 draft (talon bench, 3 timed runs a turn), qa 321 opened on sum's 24 nodes and ran four 24-node steps, three
   of which accepted nothing, at about 1.3-1.75 s each against a 0.48 s plain step; the request ran at 0.73x of
   ``ar``. Now, while every own drafted step of a new sequence accepted nothing at the largest budget they all inform,
   the carried samples' weighted share q of steps that accepted nothing there (with half a step's pseudo-count over
   one step more, so q > 0) makes a run of k such steps as likely as q ** k on the carried text; below
   ``release_nothing_p`` (5%) the samples are released as in design 8. Two steps release where fewer than 22% of the
   carried steps accepted nothing. Synthetic (the world of tests/test_control.py's test: easy and middling stretches
   on the AVX2 curves, then a 24-token answer the draft never gets; 16 seeds, the test runs 8): 38 -> 27 drafted steps
   in all, 0.831 -> 0.871 of plain decoding; on unchanged text no release at any threshold up to 10%.
   ``scripts/controller_scenarios.py`` (8 seeds) unchanged but for bf16 chat (mean 1.394 -> 1.396) and the Intel bf16
   chat with slow spells (mean 0.992 -> 0.994, worst seed 0.982 -> 0.979); replays of the recorded trees unchanged on
   the AVX2 costs (float32 or int8 draft) and within noise on the EPYC's bf16 costs (all 0.982 -> 0.983). 2% changed
   the same synthetic world less (32 drafted steps).

51. An early check where the new text already drafts clearly slower (``early_check_steps``). Design 46's check waits
   for 5 own drafted steps, and design 47 acts only while every own step accepted nothing; a short answer on which the
   draft is right now and then pays the carried choice for four or five steps. On the AVX2-only EPYC in float32 with the int8
   draft (docs/BENCHMARKS.md section 5, medians of three timed runs) qa 321 (24 tokens) opened on sum's 16-20 nodes,
   two of its five drafted steps accepted 2 tokens and the rest none, about 1 s lost a step: 0.72x of ``ar``, the whole
   of qa's shortfall (0.91x). Now the check's plain step also comes at or after ``early_check_steps`` (2) own drafted
   steps (before 5) while their measured rate (catch-up left out) is more than :data:`EARLY_CHECK_SHORTFALL` (20%)
   below rate(1); such an early check leaves drafting only if their rate is that much below its plain step's, and when
   it keeps drafting its plain step judges the drafted steps again, with :data:`CHECK_MARGIN`, at the fifth. A check
   that goes plain (early or not) also counts as a trial's end for design 12: a predicted trial waits
   ``min_probe_interval`` steps. Timed without that last part (section 5), the check moved qa 321 from five drafted
   steps to two, but design 12 predicted a 4-node trial at the very next step, from confidences that were still
   mostly sum's, and its three steps lost most of what the check had saved (0.78x of ``ar``).
   Two steps cannot tell a poor text from a good text's poor opening: the trade is a loss below plain decoding (what
   the check removes) against a speed-up given up (what a false leave costs, until trials win it back). Replays of the
   real pair's recorded trees (``scripts/replay_positions.py``, 8 seeds, median, worst seed in brackets), on the AVX2
   int8-draft costs: this CPU's texts in the bench's order qa 1.061 -> 1.154 (0.946 -> 1.120), the same sum then qa
   1.055 -> 1.126, sweep 13's sum then qa 1.134 -> 1.167, sweep 24's sum and qa 1.132 -> 1.136, every other dataset
   unchanged; on the older AVX2 float32 costs within 0.02 (humaneval 1.548 -> 1.529), on the steep profile qa 0.945 ->
   0.979; on the EPYC's float32 default kernels qa 0.937 -> 0.948, sum 0.999 -> 0.983, gsm8k 1.218 -> 1.204; on bf16
   costs identical (verification is not steep: no check runs). ``scripts/controller_scenarios.py`` (16 seeds):
   unchanged but the Intel float32 T = 1-like code (mean 1.073 -> 1.063 of plain). The adverse synthetic case
   (tests/test_control.py): a text that opens each request with two middling steps, on which those steps lose to plain
   decoding, falsely leaves in 3 of 16 requests (mean 1.145 -> 1.086 of plain; those three read 0.93-1.09), while a
   24-token answer the draft gets 40% right drafts 11 steps instead of 19 over 8 requests (0.876 -> 0.923 of plain).

Not modelled: keep_growing looks one layer ahead;
a step stopped early by keep_growing is taken to be what every larger budget would have built (true
up to keep_growing's own dependence on the budget).

Settings are a frozen :class:`ControllerSettings`; bad values raise
:class:`~talon_sd.errors.TalonError` naming the field. Records are checked on construction
(inconsistent lengths raise ValueError).
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_left, bisect_right
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

from .errors import TalonError, bad_argument

DEFAULT_LADDER = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)
DEFAULT_CALIBRATION_EDGES = (0.0, -0.1, -0.25, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0, -8.0)  # then -inf
LENGTHS_KEPT = 3  # finished sequences whose lengths estimate the tokens a request has left (design 9)
RELEASE_Z = 2.5  # a change point also needs the own mean this many standard errors from the carried one
CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.85, 0.95, 0.99)  # bins of the target's top-1 probability (design 12)
PREDICTED_WIN = 1.1  # from plain, a probe predicted this much faster starts a trial before it is due (design 12)
OWN_CONFIDENCES = 4  # a large catch-up waits for this many of the sequence's own confidences (design 14)
CATCH_UP_MARGIN = 2.0  # ... when the carried rate pays it back less than this many times over (design 14)
FOLLOW_PRIOR_SHARE = 0.5  # prior: a tree catches this share of what the draft's top-1 misses (design 12)
ANCHOR_GAP = 0.1  # below the anchor, a candidate this much faster needs no paired test (design 19)
SHAPE_PRIOR_STEPS = 1.0  # the chain bound's weight, in steps, beside drafted steps in a predicted rate (design 23)
RECENT_SAMPLES = 3  # a cost curve's size keeps at least its newest 3 samples in the fit (design 21)
CONTEXT_MIN_SPAN = 1024  # verify samples of one size T, L context tokens apart, with T x L >= this, show the context's
# cost (design 33: 16 nodes 64 tokens apart, a plain step 1024)
CONTEXT_MIN_SIZE = 4  # ... of trees this large (a plain step's is mostly timing noise)
CONTEXT_MIN_PAIRS = 8  # ... and the context slope needs this many such pairs (else 0)
CONTEXT_AGREEING = 0.75  # ... of which this share must find the longer context dearer (a sign test; else 0)
CONTEXT_MIN_EFFECT = 0.05  # ... and explain this share of a pair's seconds over the upper quartile's span (else 0)
CONTEXT_STEP_TOKENS = 32  # the verify curve is re-read at a new context once it moved this much (design 33)
PAIR_STEPS = 4  # a plain verify sample is read against the other sizes' samples within this many adds of it (design 42)
PAIR_MIN = 2  # ... when at least this many are
PAIRED_KEPT = 9  # the paired size is fitted to the median of its newest this many paired samples (design 42)
LEAN_FLOOR = 8  # a drafted choice below this leans to the first candidate >= it (or initial_budget if less; design 17)
PRIOR_NEIGHBOURS = 2  # a prompt prior needs this many earlier sequences near the prompt's agreement (design 29)
PRIOR_MIN_TOKENS = 4  # a sequence teaches the prior only after this many tokens from its drafted steps (design 29)
PRIOR_PAIRS = 64  # (agreement, drafted speed over plain) pairs kept, newest last (design 29)
PRIOR_SAMPLE_EVERY = 4  # where no agreement could change a start, only every 4th sequence measures its prompt (design 32)
PRIOR_SAMPLE_MAX = 32  # ... an interval that doubles after each sample that drafted clearly faster than plain (design 35)
FAR_VERIFY_RATIO = 1.75  # design 30 acts where verifying the first step's tree costs this many plain verifies or more
# (at the new prompt's context; 1.5 before design 34)
CHECK_VERIFY_RATIO = 1.5  # design 46 checks a carried choice where its tree costs this many plain verifies or more
CHECK_MARGIN = 0.1  # ... and leaves it when its drafted steps ran more than this much slower than the plain step
EARLY_CHECK_SHORTFALL = 0.2  # design 51: checked from early_check_steps on while their rate is this much below rate(1),
# and left when it is this much below the check's plain step's
NEW_COMMAND_MARGIN = 1.25  # a new command keeps the carried drafted choice only if it beat plain by this factor (design 27)
CHILD_PRIOR_SHARE = 0.7  # prior: an accepted, expanded node has one of its drafted children accepted 70% of the time
# why a step got its budget (:attr:`BudgetController.reason`, recorded per step in the decoding stats)
REASONS = {
    "choice": "the current choice; no trial due and no lean (or the choice is the largest candidate)",
    "trial": "a step of a trial of a larger budget (design 3)",
    "lean": "the lean rung above the choice, within lean_margin of it or not yet trusted (designs 17, 18)",
    "plain-measure": "a plain step measuring verify(1): first samples, then every plain_refresh_interval (design 13)",
    "cost-refresh": "the candidate below a drafted choice, or the choice, run once cost_refresh_interval steps "
                    "ran after its last step: its verify cost re-measured (design 21)",
    "catch-up-skip": "the drafted choice run as a plain step: its catch-up would not pay (designs 6, 14)",
    "trial-untrusted": "a trial was due but the choice has no trusted rate yet",
    "trial-no-own-draft": "a trial was due but the choice ran no drafted step in this sequence or the last (design 11)",
    "trial-catch-up": "a trial was due but its catch-up costs more than the rest affords (designs 6, 11, 15)",
    "trial-exploration": "a trial was due but trials lost their exploration share already (design 8)",
    "trial-dominated": "a trial was due but no probe could beat the choice: counted lost (design 3)",
    "trial-unpredictable": "a trial from plain was due but the recent text predicts no probe wins (design 12)",
    "trial-postponed": "a trial was due but the probe's last trials lost more than the rest affords (design 11)",
    "trial-short": "a trial was due but the sequence is expected to end within explore_min_tokens tokens (design 24)",
    "plain-check": "a plain step checking a carried drafted choice on the new text's own steps (designs 46, 51)",
}


# ---------------------------------------------------------------------------------------------- helpers
def _median(values) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    middle = n // 2
    return ordered[middle] if n % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_seconds(value) -> bool:
    return _is_number(value) and math.isfinite(value) and value >= 0


def _check_int(name: str, value, low: int, expected: str, high: int | None = None) -> None:
    if not _is_int(value) or value < low or (high is not None and value > high):
        raise bad_argument(name, value, expected)


def _check_number(name: str, value, expected: str, valid, infinite_ok: bool = False) -> None:
    if (not _is_number(value) or math.isnan(value) or (math.isinf(value) and not infinite_ok)
            or not valid(value)):
        raise bad_argument(name, value, expected)


# ---------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class StepRecord:
    """One verify step as the controller sees it. Node lists are in inclusion order (root first).

    node_log_p            [M] cumulative draft log-prob of each node, root 0.0
    node_parent           [M] parent's inclusion position, root -1 (parents precede children)
    accepted              inclusion positions of the accepted draft nodes, ascending, root excluded
                          (a root-to-node path)
    forward_widths        [F] nodes fed to each draft forward (F = 0 for a plain step)
    prefix_after_forward  [F] tree size usable once forward j is done (non-decreasing, last == M);
                          EAGLE: (1, ..., 1, M)
    draft_seconds         [F] measured seconds of each draft forward
    verify_seconds        target forward + acceptance over the M nodes
    other_seconds         the rest of the step (tree building, cache commit, bookkeeping)
    budget                the budget the controller asked for (M <= budget)
    complete              the builder stopped BEFORE reaching the budget (early stop or nothing left to
                          add): a larger budget would have given the same tree
    confidence            [A + 1] the target's top-1 probability at the root and at each accepted node, i.e.
                          before each committed token (design 12); () when the loop does not report it
    catch_up_seconds      seconds of a catch-up the drafter ran as a forward of its own before the first draft
                          forward, which then forwarded the root alone (design 23); None: none ran apart (the
                          first forward carries any catch-up)
    context_tokens        tokens in the target's cache that the tree attended to (prompt and committed tokens
                          before the root; design 33); None when the loop does not report it
    """

    node_log_p: tuple[float, ...]
    node_parent: tuple[int, ...]
    accepted: tuple[int, ...]
    forward_widths: tuple[int, ...]
    prefix_after_forward: tuple[int, ...]
    draft_seconds: tuple[float, ...]
    verify_seconds: float
    other_seconds: float
    budget: int
    complete: bool
    confidence: tuple[float, ...] = ()
    catch_up_seconds: float | None = None
    context_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("node_log_p", "node_parent", "accepted", "forward_widths", "prefix_after_forward",
                     "draft_seconds", "confidence"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        size, forwards = len(self.node_log_p), len(self.forward_widths)
        if size < 1:
            raise ValueError("StepRecord.node_log_p: needs at least the root")
        if len(self.node_parent) != size:
            raise ValueError(f"StepRecord.node_parent: {len(self.node_parent)} entries for {size} nodes")
        if self.node_parent[0] != -1 or any(not 0 <= self.node_parent[i] < i for i in range(1, size)):
            raise ValueError("StepRecord.node_parent: root -1, then 0 <= parent < position")
        previous = 0
        for position in self.accepted:
            if not previous < position < size or self.node_parent[position] != previous:
                raise ValueError(f"StepRecord.accepted: {self.accepted} is not an ascending root-to-node path")
            previous = position
        if len(self.prefix_after_forward) != forwards or len(self.draft_seconds) != forwards:
            raise ValueError(f"StepRecord: forward_widths, prefix_after_forward and draft_seconds differ in "
                             f"length ({forwards}, {len(self.prefix_after_forward)}, {len(self.draft_seconds)})")
        if any(width < 1 for width in self.forward_widths):
            raise ValueError("StepRecord.forward_widths: every draft forward has at least one node")
        prefix = self.prefix_after_forward
        if any(not 1 <= p <= size for p in prefix) or any(a > b for a, b in zip(prefix, prefix[1:])):
            raise ValueError(f"StepRecord.prefix_after_forward: {prefix} must be non-decreasing in [1, {size}]")
        if (prefix[-1] if prefix else 1) != size:
            raise ValueError(f"StepRecord: a tree of {size} nodes needs its last forward's prefix == {size} "
                             "(no forward: the root alone)")
        for name in ("verify_seconds", "other_seconds"):
            if not _is_seconds(getattr(self, name)):
                raise ValueError(f"StepRecord.{name}: got {getattr(self, name)!r}, expected finite seconds >= 0")
        if not all(_is_seconds(s) for s in self.draft_seconds):
            raise ValueError("StepRecord.draft_seconds: expected finite seconds >= 0")
        if self.catch_up_seconds is not None and (not _is_seconds(self.catch_up_seconds) or not forwards):
            raise ValueError(f"StepRecord.catch_up_seconds: got {self.catch_up_seconds!r}, expected None or finite "
                             "seconds >= 0 before a step's first draft forward")
        if not 1 <= size <= self.budget:
            raise ValueError(f"StepRecord.budget: a tree of {size} nodes cannot come from budget {self.budget}")
        if not self.complete and size != self.budget:
            raise ValueError(f"StepRecord.complete: False, but the tree has {size} < budget {self.budget} nodes "
                             "(a tree short of its budget is complete)")
        if self.confidence and (len(self.confidence) != len(self.accepted) + 1
                                or not all(_is_number(q) and 0.0 <= q <= 1.0 for q in self.confidence)):
            raise ValueError(f"StepRecord.confidence: {len(self.confidence)} values for {len(self.accepted) + 1} "
                             "committed tokens; expected () or one probability in [0, 1] per committed token")

    @property
    def size(self) -> int:
        """M, the number of verified nodes (root counted)."""
        return len(self.node_log_p)


class PrefixOutcome(NamedTuple):
    """What a step would have been with budget k (its tree = the first ``tree_size`` nodes)."""

    accepted: int  # accepted draft tokens (bonus excluded)
    forwards: int  # draft forwards budget k runs
    draft_widths: tuple[int, ...]  # [forwards] their widths
    tree_size: int  # verified nodes, min(k, M)


def informs(record: StepRecord, budget: int) -> bool:
    """Whether ``record`` says what budget ``budget`` would have done (k <= M, or the tree was complete)."""
    return budget <= record.size or record.complete


def prefix_outcome(record: StepRecord, budget: int) -> PrefixOutcome:
    """The outcome of budget k counterfactually, from the prefix property (module docstring).

    accepted = accepted positions < k; forwards = 0 for k = 1, else the smallest j with
    prefix_after_forward[j - 1] >= k (every forward when k > M, which needs ``complete``).
    Raises ValueError for a budget the record does not inform.
    """
    if budget < 1 or not informs(record, budget):
        raise ValueError(f"budget {budget}: a step of budget {record.budget} that built {record.size} nodes "
                         f"({'complete' if record.complete else 'cut by its budget'}) does not inform it")
    if budget == 1:
        return PrefixOutcome(0, 0, (), 1)
    if budget > record.size:
        forwards = len(record.forward_widths)
    else:
        forwards = bisect_left(record.prefix_after_forward, budget) + 1
    return PrefixOutcome(bisect_left(record.accepted, budget), forwards, record.forward_widths[:forwards],
                         min(budget, record.size))


def is_layered(record: StepRecord) -> bool:
    """Whether each draft forward expanded exactly the nodes the previous one added (TALON, chain), as
    the record's widths and prefixes show; not so for EAGLE, whose rerank hides its frontiers."""
    widths, prefix = record.forward_widths, record.prefix_after_forward
    return bool(widths) and widths[0] == 1 and all(
        prefix[j - 1] - (prefix[j - 2] if j >= 2 else 1) == widths[j] for j in range(1, len(widths)))


def expanded_positions(record: StepRecord) -> list[int]:
    """Inclusion positions of the nodes fed to a draft forward: for a layered record every node but the
    last layer's; otherwise the nodes that have children stand in."""
    if is_layered(record):
        prefix = record.prefix_after_forward
        return [0] + list(range(1, prefix[-2] if len(prefix) >= 2 else 1))
    return sorted(set(record.node_parent[1:]))


def fully_expanded_positions(record: StepRecord) -> list[int]:
    """:func:`expanded_positions` less the parents of a last layer the budget cut (they lost children to the
    budget, not to the draft)."""
    expanded = expanded_positions(record)
    forwards = len(record.forward_widths)
    if not record.complete and forwards >= 2 and is_layered(record):
        last_frontier_start = record.prefix_after_forward[-3] if forwards >= 3 else 1
        expanded = [p for p in expanded if p < last_frontier_start]
    return expanded


# ---------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class CostPrior:
    """A warm start for the cost curves, e.g. from a saved ``talon tune`` profile or the last generation.

    verify_seconds    tree size -> seconds of one verify step
    draft_seconds     forward width -> seconds of one draft forward
    overhead_seconds  draft forwards per step -> seconds of the rest of the step (optional)
    """

    verify_seconds: dict[int, float]
    draft_seconds: dict[int, float]
    overhead_seconds: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, smallest in (("verify_seconds", 1), ("draft_seconds", 1), ("overhead_seconds", 0)):
            table = getattr(self, name)
            if not isinstance(table, Mapping) or not all(
                    _is_int(size) and size >= smallest and _is_seconds(seconds) for size, seconds in table.items()):
                raise bad_argument(name, table, f"a mapping of integers >= {smallest} to finite seconds >= 0")
            object.__setattr__(self, name, dict(table))


@dataclass(frozen=True)
class ControllerSettings:
    """How the online controller chooses budgets (module docstring, "Design").

    max_budget              largest budget N it may choose (root counted)
    initial_budget          the first step's budget (or a tuned profile's N)
    allow_plain             N = 1 (a plain decoding step) is a candidate
    ladder                  candidate budgets (cut at max_budget; max_budget and initial_budget added)
    window                  samples each candidate keeps (the most recent steps that inform it)
    half_life               steps after which a sample's weight halves
    min_steps               samples before a candidate's rate is trusted
    probe_factor            a trial probes the smallest candidate >= probe_factor x the current choice (with
                            lean_margin 0; otherwise a drafted choice's probe is its lean rung, design 17)
                            (and >= initial_budget)
    plain_probe_budget      ... and from plain (N = 1), the smallest candidate >= this
    probe_levels            from plain decoding, after a lost trial the next probes twice as far, up to
                            2 ** (levels - 1) x
    probe_steps             steps per trial (more while the probe has fewer than min_steps samples)
    min_probe_interval      steps between trials after one that moved the choice up (and at the start)
    max_probe_interval      cap of the interval, which doubles after each trial that did not
    plain_refresh_interval  steps between plain steps that re-measure verify(1) (0: never)
    cost_refresh_interval   at most once in this many steps, the candidate below a drafted choice or the choice
                            runs one step once this many steps ran after its last one (its verify cost
                            re-measured); the verify curve fits each size from its samples of the last twice
                            this many steps, at least its newest RECENT_SAMPLES (0: neither; design 21)
    explore_min_tokens      trials, lean steps and cost refreshes run only while the sequence is expected to commit at
                            least this many more tokens (design 24; 0: always)
    dominance_margin        skip a probe whose optimistic rate is below (1 - margin) x the current rate
    cost_samples            recent samples kept per size in each cost curve
    calibration_edges       bin edges of cumulative draft log p, from 0.0 down (the last bin goes to -inf)
    calibration_decay       weight kept by past calibration counts at each drafted step
    calibration_prior_strength  pseudo-nodes of the calibration's Beta prior
    early_stop              keep_growing may stop a step's growth (False: it always says grow)
    carried_weight          at a new sequence, the carried acceptance samples are scaled down so that no
                            candidate's total weight exceeds this many steps (math.inf: kept as they were)
    trial_cost_share        a trial starts only if its catch-up plus what the last trials of its probe lost
                            cost at most this share of the plain seconds of the tokens expected to be left, or
                            less than half of what the sequence's own text predicts a win saves (design 15)
    release_ratio           a new sequence's carried samples are released (weighed as one step) once its own
                            drafted steps' mean committed tokens differ from theirs by more than this factor
    release_steps           ... judged from this many of its own drafted steps on
    release_nothing_p       ... or while all of those steps accepted nothing, once a run that long is less likely than
                            this among the carried steps (design 47; 0: never; math.inf release_ratio: neither)
    exploration_share       a trial starts only while the seconds trials lost against the choice's rate are at
                            most this share of the seconds observed (bounded regret, design 8) ...
    exploration_half_life   ... both counted with weights halving every this many steps (math.inf: all alike)
    predict_trials          from plain decoding, postpone a trial while the target's confidence on the last
                            ``confidence_window`` tokens says the probe cannot win (design 12)
    confidence_window       committed tokens whose confidence the prediction replays
    lean_margin             a drafted choice runs the next candidate above it (at least min(initial_budget,
                            LEAN_FLOOR)) while that one's rate is within this share of the choice's or not yet
                            trusted (design 17; 0: never)
    lean_reach              ... and, below initial_budget, at least this many times the choice, up to
                            initial_budget (design 18; 1: the next rung)
    anchor_z                a drafted candidate other than initial_budget may be chosen only while its paired rate
                            beats initial_budget's by more than this many standard errors on the steps that
                            inform both (design 19; 0: any trusted candidate, as in design 18)
    anchor_gap_steps        ... or, below it, by more than ANCHOR_GAP, once initial_budget has this many samples
                            or is no faster than plain decoding (design 20; 0: as soon as it is trusted, design 19)
    bet_window              a catch-up judged on the sequence's own text (designs 14, 25) reads the rate predicted
                            from up to this many of its target confidences, not the last confidence_window (design 28;
                            the trials of design 15 still read confidence_window; below it, the bet reads fewer)
    bet_margin              ... and such a catch-up, when above trial_cost_share of the rest's plain seconds (a bet),
                            is paid only when the rest, drafted at that rate, saves this many times its seconds
                            (design 28; 1: once over, as a smaller catch-up)
    leave_plain_margin      from plain decoding, a drafted candidate becomes the choice only when its rate beats
                            plain decoding's by more than this share (design 28; 0: any faster candidate)
    prompt_prior_width      a new sequence whose prompt agreement is known starts plain when the earlier sequences
                            whose agreement lies within this distance of it drafted, on average, slower than plain
                            decoding (design 29; 0: never, design 30 included)
    prompt_gap              ... and also when its agreement lies more than this below that of the last sequence that
                            taught the prior, too few are near and none of those drafted as fast as plain, and
                            verifying the first step's tree costs at least FAR_VERIFY_RATIO plain verifies (design 30;
                            0: never; prompt_prior_width 0 turns it off too)
    paired_plain            while fewer than RECENT_SAMPLES plain steps lie within the verify curve's horizon (twice
                            cost_refresh_interval; none without one), verify(1) is read from plain steps' seconds against
                            the drafted steps' around them, at the host speed of the drafted sizes' fit (design 42;
                            False: as measured)
    reopen_on_fall          when the choice falls to a smaller drafted budget, the trial interval starts over at
                            ``min_probe_interval`` (design 45; False: it keeps the length the last trials left)
    plain_check_steps       where verification is steep, a sequence that opened on a carried drafted choice runs one
                            plain step after this many of its own drafted steps and goes plain if they were more than
                            CHECK_MARGIN slower than it (design 46; 0: never)
    early_check_steps       ... and already from this many (fewer) drafted steps on while their rate is more than
                            EARLY_CHECK_SHORTFALL below rate(1), leaving drafting if it is that much below the check's
                            plain step's (design 51; 0: only after plain_check_steps)
    """

    max_budget: int = 64
    initial_budget: int = 8
    allow_plain: bool = True
    ladder: tuple[int, ...] = DEFAULT_LADDER
    window: int = 32
    half_life: float = 32.0
    min_steps: int = 3
    probe_factor: float = 2.0
    plain_probe_budget: int = 4
    probe_steps: int = 2
    probe_levels: int = 3
    min_probe_interval: int = 4
    max_probe_interval: int = 64
    plain_refresh_interval: int = 64
    dominance_margin: float = 0.05
    cost_samples: int = 9
    calibration_edges: tuple[float, ...] = DEFAULT_CALIBRATION_EDGES
    calibration_decay: float = 0.97
    calibration_prior_strength: float = 2.0
    early_stop: bool = False  # off by default: see design 4 (it starved chat trees on the real pair)
    carried_weight: float = 8.0
    trial_cost_share: float = 0.05
    release_ratio: float = 1.5
    release_steps: int = 2
    release_nothing_p: float = 0.05
    exploration_share: float = 0.05
    exploration_half_life: float = 64.0
    predict_trials: bool = True
    confidence_window: int = 16
    lean_margin: float = 0.01
    lean_reach: float = 2.0
    anchor_z: float = 1.0
    anchor_gap_steps: int = 8
    cost_refresh_interval: int = 16
    explore_min_tokens: int = 32
    bet_window: int = 64
    bet_margin: float = 1.5
    leave_plain_margin: float = 0.05
    prompt_prior_width: float = 0.05
    prompt_gap: float = 0.15
    paired_plain: bool = True
    reopen_on_fall: bool = True
    plain_check_steps: int = 5
    early_check_steps: int = 2

    def __post_init__(self) -> None:
        for name in ("allow_plain", "early_stop", "predict_trials", "paired_plain", "reopen_on_fall"):
            if not isinstance(getattr(self, name), bool):
                raise bad_argument(name, getattr(self, name), "True or False")
        _check_int("max_budget", self.max_budget, 1 if self.allow_plain else 2,
                   "an integer >= 1" if self.allow_plain else "an integer >= 2 (allow_plain is False)")
        _check_int("initial_budget", self.initial_budget, 1 if self.allow_plain else 2,
                   f"an integer in [{1 if self.allow_plain else 2}, max_budget={self.max_budget}]", self.max_budget)
        if (not isinstance(self.ladder, (tuple, list)) or not self.ladder
                or not all(_is_int(k) and k >= 1 for k in self.ladder)):
            raise bad_argument("ladder", self.ladder, "a non-empty tuple of integers >= 1")
        object.__setattr__(self, "ladder", tuple(sorted(set(self.ladder))))
        for name, low in (("window", 1), ("min_steps", 1), ("plain_probe_budget", 2), ("probe_steps", 1),
                          ("probe_levels", 1), ("min_probe_interval", 1), ("cost_samples", 1),
                          ("plain_refresh_interval", 0), ("release_steps", 1), ("confidence_window", 1),
                          ("anchor_gap_steps", 0), ("cost_refresh_interval", 0), ("explore_min_tokens", 0),
                          ("bet_window", 1), ("plain_check_steps", 0),
                          ("early_check_steps", 0)):
            _check_int(name, getattr(self, name), low, f"an integer >= {low}")
        if self.min_steps > self.window:
            raise bad_argument("min_steps", self.min_steps, f"at most window={self.window}")
        _check_int("max_probe_interval", self.max_probe_interval, self.min_probe_interval,
                   f"an integer >= min_probe_interval={self.min_probe_interval}")
        _check_number("half_life", self.half_life, "a number > 0", lambda x: x > 0)
        _check_number("carried_weight", self.carried_weight, "a number > 0 (math.inf: no cap)", lambda x: x > 0,
                      infinite_ok=True)
        _check_number("trial_cost_share", self.trial_cost_share, "a number >= 0", lambda x: x >= 0)
        _check_number("release_ratio", self.release_ratio, "a number > 1 (math.inf: never release)",
                      lambda x: x > 1, infinite_ok=True)
        _check_number("release_nothing_p", self.release_nothing_p, "a number in [0, 1] (0: no design 47)",
                      lambda x: 0 <= x <= 1)
        _check_number("exploration_half_life", self.exploration_half_life, "a number > 0 (math.inf: no decay)",
                      lambda x: x > 0, infinite_ok=True)
        _check_number("exploration_share", self.exploration_share, "a number >= 0 (math.inf: no bound)",
                      lambda x: x >= 0, infinite_ok=True)
        _check_number("probe_factor", self.probe_factor, "a number > 1", lambda x: x > 1)
        _check_number("dominance_margin", self.dominance_margin, "a number in [0, 1)", lambda x: 0 <= x < 1)
        _check_number("bet_margin", self.bet_margin, "a finite number >= 1", lambda x: x >= 1)
        _check_number("leave_plain_margin", self.leave_plain_margin, "a finite number >= 0", lambda x: x >= 0)
        _check_number("prompt_prior_width", self.prompt_prior_width, "a number in [0, 1] (0: no prompt prior)",
                      lambda x: 0 <= x <= 1)
        _check_number("prompt_gap", self.prompt_gap, "a number in [0, 1] (0: no gap rule)", lambda x: 0 <= x <= 1)
        _check_number("lean_reach", self.lean_reach, "a number >= 1 (1: the next rung)", lambda x: x >= 1)
        _check_number("anchor_z", self.anchor_z, "a number >= 0 (0: no anchor)", lambda x: x >= 0)
        _check_number("lean_margin", self.lean_margin, "a number in [0, 1) (0: never lean)", lambda x: 0 <= x < 1)
        _check_number("calibration_decay", self.calibration_decay, "a number in (0, 1]", lambda x: 0 < x <= 1)
        _check_number("calibration_prior_strength", self.calibration_prior_strength, "a number > 0",
                      lambda x: x > 0)
        edges = self.calibration_edges
        if (not isinstance(edges, (tuple, list)) or len(edges) < 2 or edges[0] != 0
                or not all(_is_number(e) and math.isfinite(e) for e in edges)
                or any(a <= b for a, b in zip(edges, edges[1:]))):
            raise bad_argument("calibration_edges", edges, "finite log-probabilities decreasing from 0.0 "
                               "(at least two)")
        object.__setattr__(self, "calibration_edges", tuple(float(e) for e in edges))

    def candidates(self) -> tuple[int, ...]:
        """The candidate budgets, ascending: the ladder up to max_budget, plus max_budget and
        initial_budget; without 1 unless allow_plain."""
        chosen = {k for k in self.ladder if k <= self.max_budget} | {self.max_budget, self.initial_budget}
        return tuple(sorted(k for k in chosen if self.allow_plain or k >= 2))


# ---------------------------------------------------------------------------------------------- costs
class CostCurve:
    """Seconds as a non-decreasing function of a size (tree nodes, forward width, forwards per step).

    Keeps the last ``keep`` samples per size; the curve runs through the per-size medians (with ``horizon``,
    of the samples among the last ``horizon`` adds, at least the newest :data:`RECENT_SAMPLES`) after a
    weighted isotonic fit, linearly in between, and outside the known sizes with the larger of the last
    segment's and the whole curve's slope (floored at 0 seconds). ``prior`` points seed it and are
    rescaled by the median measured/prior ratio once measurements exist. Call :meth:`refit` after
    :meth:`add` before reading it.
    """

    def __init__(self, keep: int, prior: Mapping[int, float] | None = None, horizon: int | None = None,
                 paired: int | None = None) -> None:
        if horizon is not None and (not _is_int(horizon) or horizon < 1):
            raise bad_argument("horizon", horizon, "an integer >= 1 or None")
        if paired is not None and (not _is_int(paired) or paired < 0):
            raise bad_argument("paired", paired, "an integer >= 0 or None")
        self.keep = keep
        self.horizon = horizon  # only samples among the last this many adds are fitted (None: all; design 21)
        self.paired = paired  # the size read against its neighbours' samples (None: none; design 42)
        self._last_adds: deque[tuple[int, float, int | None]] = deque(maxlen=PAIR_STEPS)  # (size, seconds, context)
        # the paired size's samples with their neighbours: the last PAIRED_KEPT paired ones and those still in reach
        self._pairs: deque[_Pair] = deque(maxlen=PAIRED_KEPT + PAIR_STEPS + 1)
        self.samples: dict[int, deque[float]] = {}
        self._clocks: dict[int, deque[int]] = {}  # [like samples] the add count at each sample
        self._contexts: dict[int, deque[int | None]] = {}  # [like samples] the context each was measured at
        self.context: int | None = None  # the context the curve is read at (design 33; None: as measured)
        self.context_slope = 0.0  # seconds per size unit per context token (design 33)
        self.clock = 0  # samples added so far
        points = sorted((prior or {}).items())
        self._prior = _fit([x for x, _ in points], [y for _, y in points], [1.0] * len(points))
        self.xs: list[int] = []  # known sizes, ascending
        self.ys: list[float] = []  # [len(xs)] fitted seconds
        self.slope = 0.0  # seconds per unit of size outside xs
        self._stale = True
        self.refit()

    def add(self, size: int, seconds: float, context: int | None = None) -> None:
        """One sample of ``size``; ``context``: the tokens the measured forward attended to beside its own (design
        33), None when unknown."""
        samples = self.samples.get(size)
        if samples is None:
            samples = self.samples[size] = deque(maxlen=self.keep)
            self._clocks[size] = deque(maxlen=self.keep)
            self._contexts[size] = deque(maxlen=self.keep)
        samples.append(float(seconds))
        self._clocks[size].append(self.clock)
        self._contexts[size].append(context)
        if self.paired is not None:  # design 42: the paired size's samples collect the other sizes' around them
            added = (size, float(seconds), context)
            if size == self.paired:  # a sample that found too few neighbours in its reach leaves room for others
                self._pairs = deque((pair for pair in self._pairs if len(pair.neighbours) >= PAIR_MIN
                                     or self.clock - pair.clock < PAIR_STEPS), maxlen=self._pairs.maxlen)
                before = [(other, y, at) for other, y, at in self._last_adds if other != size]
                self._pairs.append(_Pair(self.clock, float(seconds), context, before))
            else:
                for pair in reversed(self._pairs):
                    if self.clock - pair.clock > PAIR_STEPS:
                        break
                    pair.neighbours.append(added)
            self._last_adds.append(added)
        self.clock += 1
        self._stale = True

    def keep_newest(self, size: int, count: int) -> None:
        """Forget all but ``size``'s newest ``count`` samples (for the paired size, its older pairs too): what was measured
        of it before no longer stands for the machine and text at hand (design 46). Call :meth:`refit` before reading."""
        if size not in self.samples:
            return
        for store in (self.samples, self._clocks, self._contexts):
            store[size] = deque(list(store[size])[-count:], maxlen=self.keep)
        if size == self.paired:
            oldest = self._clocks[size][0] if self._clocks[size] else self.clock
            self._pairs = deque((pair for pair in self._pairs if pair.clock >= oldest), maxlen=self._pairs.maxlen)
        self._stale = True

    def read_at(self, context: int | None) -> bool:
        """Read the curve at ``context`` tokens from now on (design 33): every sample measured at a known context
        moves by ``context_slope x size x (context - its context)``. A move of less than
        :data:`CONTEXT_STEP_TOKENS` tokens (or a tenth of the context) is ignored, so that a growing sequence does not
        refit at every step. Returns whether the curve changed (then :meth:`refit` before reading it)."""
        if context is None or self.context is not None and abs(context - self.context) < max(
                CONTEXT_STEP_TOKENS, 0.1 * self.context):
            return False
        self.context, self._stale = int(context), True
        return True

    def _context_slope(self) -> float:
        """Theil-Sen over pairs of samples of one size (>= :data:`CONTEXT_MIN_SIZE`) whose contexts lie far enough
        apart (size x context difference >= :data:`CONTEXT_MIN_SPAN`): the median of (seconds difference) / (size x
        context difference). 0 unless there are :data:`CONTEXT_MIN_PAIRS` pairs, :data:`CONTEXT_AGREEING` of them
        find the longer context dearer, and the difference it explains over the upper quartile of the pairs' spans is
        at least :data:`CONTEXT_MIN_EFFECT` of their median seconds: else what the pairs show is timing noise (design
        33)."""
        slopes, spans, seconds = [], [], []
        for size, samples in self.samples.items():
            if size < CONTEXT_MIN_SIZE:
                continue
            measured = [(c, y) for c, y in zip(self._contexts[size], samples) if c is not None]
            for i, (context_i, seconds_i) in enumerate(measured):
                for context_j, seconds_j in measured[i + 1:]:
                    span = size * abs(context_i - context_j)
                    if span >= CONTEXT_MIN_SPAN:
                        slopes.append((seconds_i - seconds_j) / (size * (context_i - context_j)))
                        spans.append(span)
                        seconds.append(0.5 * (seconds_i + seconds_j))
        if len(slopes) < CONTEXT_MIN_PAIRS or sum(slope > 0 for slope in slopes) < CONTEXT_AGREEING * len(slopes):
            return 0.0
        slope, wide = _median(slopes), sorted(spans)[(3 * len(spans)) // 4]  # the upper quartile's span
        return slope if slope * wide >= CONTEXT_MIN_EFFECT * _median(seconds) else 0.0

    def age(self, size: int) -> float:
        """Adds after ``size``'s newest sample (0: it was the last add; math.inf if never measured)."""
        clocks = self._clocks.get(size)
        return self.clock - 1 - clocks[-1] if clocks else math.inf

    def _at_read_context(self, size: int, seconds: float, measured_at: int | None) -> float:
        """``seconds`` of a sample of ``size`` measured at context ``measured_at``, moved to the context the curve is read
        at by ``context_slope`` (design 33; as measured where either context is unknown)."""
        if self.context_slope <= 0 or measured_at is None or self.context is None:
            return seconds
        return seconds + self.context_slope * size * (self.context - measured_at)

    def _fresh(self, size: int) -> int | float:
        """How many of ``size``'s kept samples lie among the last ``horizon`` adds (all of them: inf without one)."""
        if self.horizon is None:
            return math.inf
        return sum(1 for c in self._clocks[size] if self.clock - c <= self.horizon)

    def _recent(self) -> dict[int, list[float]]:
        """Per size, the samples the fit uses (design 21): those among the last ``horizon`` adds (age < horizon),
        or the newest :data:`RECENT_SAMPLES` if fewer are (every kept sample when ``horizon`` is None); each moved to
        the context the curve is read at (design 33)."""
        self.context_slope = self._context_slope() if self.context is not None else 0.0
        used = {}
        for size, samples in self.samples.items():
            values = list(samples)
            if self.context_slope > 0:
                values = [self._at_read_context(size, y, c) for y, c in zip(values, self._contexts[size])]
            if self.horizon is not None:
                values = values[-max(self._fresh(size), RECENT_SAMPLES):]
            used[size] = values
        return used

    def refit(self) -> None:
        if not self._stale:
            return
        self._stale = False
        measured = {size: (_median(values), float(len(values))) for size, values in self._recent().items()}
        if self.paired in self.samples and self._fresh(self.paired) < RECENT_SAMPLES:
            paired = self._paired_seconds(measured)  # design 42: the paired size's own samples are stale
            if paired is not None:  # (weighed in the fit as the samples it replaces)
                measured[self.paired] = (paired, measured[self.paired][1])
        prior_xs, prior_ys, prior_slope = self._prior
        points = {}
        if prior_xs:
            ratios = [seconds / reference for size, (seconds, _) in measured.items()
                      if (reference := _interpolate(prior_xs, prior_ys, prior_slope, size)) > 0]
            scale = _median(ratios) if ratios else 1.0
            points = {size: (seconds * scale, 1.0) for size, seconds in zip(prior_xs, prior_ys)}
        points.update(measured)
        xs = sorted(points)
        self.xs, self.ys, self.slope = _fit(xs, [points[x][0] for x in xs], [points[x][1] for x in xs])

    def _paired_seconds(self, measured: dict[int, tuple[float, float]]) -> float | None:
        """Design 42, where fewer than :data:`RECENT_SAMPLES` of the paired size's samples lie within the horizon (its
        fit would read old samples beside the other sizes' recent ones): its seconds at the host speed the other
        sizes' fit stands for:
        its newest :data:`PAIRED_KEPT` samples among those with at least :data:`PAIR_MIN` neighbours (other sizes'
        samples within :data:`PAIR_STEPS` adds of it), each times the median over its neighbours of (the fit without the
        paired size at the neighbour's size) / (the neighbour's seconds), all moved to the read context (design 33); the
        median of those. None without such a sample or without another size measured (the paired size is then fitted
        as any other)."""
        pairs = [pair for pair in self._pairs if len(pair.neighbours) >= PAIR_MIN][-PAIRED_KEPT:]
        others = {size: point for size, point in measured.items() if size != self.paired}
        if not pairs or not others:
            return None
        xs = sorted(others)
        fitted = _fit(xs, [others[x][0] for x in xs], [others[x][1] for x in xs])
        values = []
        for pair in pairs:
            ratios = [_interpolate(*fitted, size) / seconds for size, y, at in pair.neighbours
                      if (seconds := self._at_read_context(size, y, at)) > 0]
            if ratios:
                values.append(self._at_read_context(self.paired, pair.seconds, pair.context) * _median(ratios))
        return _median(values) if values else None

    def has(self, size: int, samples: int = 1) -> bool:
        """Whether ``size`` was measured (at least ``samples`` times among the kept ones) or given by the prior."""
        return len(self.samples.get(size, ())) >= samples or size in self._prior[0]

    def __call__(self, size: float) -> float:
        return _interpolate(self.xs, self.ys, self.slope, size)

    def table(self, up_to: int) -> list[float]:
        """[up_to + 1] the curve at sizes 0..up_to, for fast lookups."""
        xs, ys, slope = self.xs, self.ys, self.slope
        if not xs:
            return [0.0] * (up_to + 1)
        values, right = [], 1
        for size in range(up_to + 1):
            if size <= xs[0]:
                values.append(max(ys[0] - slope * (xs[0] - size), 0.0))
            elif size >= xs[-1]:
                values.append(ys[-1] + slope * (size - xs[-1]))
            else:
                while xs[right] < size:
                    right += 1
                x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
                values.append(y0 + (y1 - y0) * (size - x0) / (x1 - x0))
        return values

    def points(self) -> dict[int, float]:
        """The fitted curve at its known sizes (measured or prior)."""
        return dict(zip(self.xs, self.ys))

    def medians(self) -> dict[int, float]:
        """Measured sizes only: the median of all their kept samples (the fit may use fewer: ``horizon``)."""
        return {size: _median(samples) for size, samples in sorted(self.samples.items())}


@dataclass
class _Pair:
    """A sample of a :class:`CostCurve`'s paired size and the other sizes' samples added around it (design 42); the
    curve appends to ``neighbours`` while later adds are within :data:`PAIR_STEPS` of it."""

    clock: int  # the curve's add count at the sample
    seconds: float
    context: int | None
    neighbours: list[tuple[int, float, int | None]]  # (size, seconds, context) of other sizes within PAIR_STEPS adds


def _fit(xs: list[int], ys: list[float], weights: list[float]) -> tuple[list[int], list[float], float]:
    """Weighted isotonic (non-decreasing) fit of ys over ascending xs, and the extrapolation slope."""
    fitted = _isotonic(ys, weights)
    slope = 0.0
    if len(xs) >= 2:
        last = (fitted[-1] - fitted[-2]) / (xs[-1] - xs[-2])
        overall = (fitted[-1] - fitted[0]) / (xs[-1] - xs[0])
        slope = max(last, overall, 0.0)
    return list(xs), fitted, slope


def _seconds_saved(tokens: float, plain: float, drafted: float) -> float:
    """Seconds that committing ``tokens`` at rate ``drafted`` saves over plain decoding's rate ``plain``."""
    return tokens * (1.0 / plain - 1.0 / drafted)


def _bucket(tokens: int) -> int:
    """The catch-up curve's size for ``tokens``: the next power of two (its samples are scaled to it)."""
    return 1 << max(tokens - 1, 0).bit_length()


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Pool-adjacent-violators: the non-decreasing sequence closest to ``values`` in weighted squares."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for value, weight in zip(values, weights):
        blocks.append([value * weight, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, weight_sum, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += weight_sum
            blocks[-1][2] += count
    fitted = []
    for total, weight_sum, count in blocks:
        fitted.extend([total / weight_sum] * int(count))
    return fitted


def _interpolate(xs: list[int], ys: list[float], slope: float, x: float) -> float:
    if not xs:
        return 0.0
    if x <= xs[0]:
        return max(ys[0] - slope * (xs[0] - x), 0.0)
    if x >= xs[-1]:
        return ys[-1] + slope * (x - xs[-1])
    right = bisect_right(xs, x)
    x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


# ---------------------------------------------------------------------------------------------- calibration
class Calibration:
    """a(p) = P(node accepted) and e(p) = P(a child accepted | node expanded), in bins of the node's
    cumulative draft log p, as decayed Beta posteriors (module docstring, design 4)."""

    def __init__(self, edges: tuple[float, ...], decay: float, prior_strength: float) -> None:
        self.edges, self.decay, self.strength = edges, decay, prior_strength
        self._bounds = sorted(edges[1:])  # ascending
        middles = [(a + b) / 2 for a, b in zip(edges, edges[1:])] + [edges[-1] - 1.0]
        self.accept_prior = [math.exp(m) for m in middles]
        self.child_prior = [CHILD_PRIOR_SHARE * a for a in self.accept_prior]
        bins = len(edges)
        self.nodes = [0.0] * bins  # decayed count of nodes seen per bin
        self.accepted_nodes = [0.0] * bins
        self.expanded = [0.0] * bins
        self.expanded_with_child = [0.0] * bins
        self.accept = list(self.accept_prior)  # [bins] current a
        self.child = list(self.child_prior)  # [bins] current e
        self.steps = 0

    def bin(self, log_p: float) -> int:
        """0 for log p in (edges[1], 0], ..., the last bin for log p <= edges[-1]."""
        return len(self._bounds) - bisect_left(self._bounds, log_p)

    def observe(self, record: StepRecord) -> None:
        decay = self.decay
        for counts in (self.nodes, self.accepted_nodes, self.expanded, self.expanded_with_child):
            for i in range(len(counts)):
                counts[i] *= decay
        accepted = set(record.accepted)
        log_p = record.node_log_p
        for position in range(1, record.size):
            b = self.bin(log_p[position])
            self.nodes[b] += 1.0
            if position in accepted:
                self.accepted_nodes[b] += 1.0
        with_accepted_child = {record.node_parent[position] for position in record.accepted}
        for position in fully_expanded_positions(record):
            b = self.bin(log_p[position])
            self.expanded[b] += 1.0
            if position in with_accepted_child:
                self.expanded_with_child[b] += 1.0
        s = self.strength
        self.accept = [(hit + s * prior) / (n + s)
                       for hit, n, prior in zip(self.accepted_nodes, self.nodes, self.accept_prior)]
        self.child = [(hit + s * prior) / (n + s)
                      for hit, n, prior in zip(self.expanded_with_child, self.expanded, self.child_prior)]
        self.steps += 1

    def rows(self) -> list[dict]:
        labels = [f"({b:g}, {a:g}]" for a, b in zip(self.edges, self.edges[1:])] + [f"(-inf, {self.edges[-1]:g}]"]
        return [{"log_p": label, "accepted": round(a, 4), "child_accepted": round(e, 4), "nodes": round(n, 2),
                 "expanded": round(x, 2)}
                for label, a, e, n, x in zip(labels, self.accept, self.child, self.nodes, self.expanded)]


class Predictability:
    """How predictable the current text is, from the target's own confidence (design 12).

    ``recent``: the target's top-1 probability before each of the last ``history`` (at least ``window``)
    committed tokens, which every step reports, a plain step too; predictions read its last ``window`` unless
    told how many (design 28). ``follow(q)``: P(the tree holds the token the target commits
    next | the target's top-1 probability there is q), learned from drafted steps at every accepted-path
    position whose node was expanded, per bin of q (``CONFIDENCE_EDGES``) as decayed Beta posteriors; prior
    ``q + (1 - q) / 2`` at the bin's middle (a tree catches about half of what the draft's top-1 misses).
    :meth:`chain_tokens` replays the recent confidences as a chain: the committed tokens a step of F
    forwards would expect on text like the last ``window`` tokens."""

    def __init__(self, window: int, decay: float, prior_strength: float, history: int | None = None) -> None:
        self.window = window
        self.recent: deque[float] = deque(maxlen=max(window, history or window))  # [<= maxlen] oldest first
        self.decay, self.strength = decay, prior_strength
        lows = (0.0,) + CONFIDENCE_EDGES
        highs = CONFIDENCE_EDGES + (1.0,)
        middles = [(a + b) / 2 for a, b in zip(lows, highs)]
        self.prior = [m + FOLLOW_PRIOR_SHARE * (1.0 - m) for m in middles]
        self.top_prior = middles  # prior of a chain: the draft's top-1 is the target's as often as the target is sure
        self.seen = [0.0] * len(self.prior)  # decayed expanded positions per bin
        self.held = [0.0] * len(self.prior)  # ... whose next committed token was in the tree
        self.held_top = [0.0] * len(self.prior)  # ... whose next committed token was the draft's top-1 child there
        self.follow_table = list(self.prior)
        self.top_follow_table = list(self.top_prior)

    def follow(self, q: float, top: bool = False) -> float:
        """P(the tree holds the next committed token | the target's top-1 probability q); ``top``: P(the draft's
        top-1 child is that token), what a chain of one-node forwards holds (design 23)."""
        return (self.top_follow_table if top else self.follow_table)[bisect_right(CONFIDENCE_EDGES, q)]

    def observe(self, record: StepRecord) -> None:
        if not record.confidence:
            return
        self.recent.extend(record.confidence)
        if not record.forward_widths:
            return
        for counts in (self.seen, self.held, self.held_top):
            for i in range(len(counts)):
                counts[i] *= self.decay
        expanded = set(fully_expanded_positions(record))
        best_child: dict[int, int] = {}  # parent -> its child of highest draft log p (the first of equals)
        for child in range(1, record.size):
            parent = record.node_parent[child]
            if parent not in best_child or record.node_log_p[child] > record.node_log_p[best_child[parent]]:
                best_child[parent] = child
        path = (0,) + record.accepted
        for depth, (node, q) in enumerate(zip(path, record.confidence)):
            if node in expanded:  # the draft had its chance at the next token
                b = bisect_right(CONFIDENCE_EDGES, q)
                self.seen[b] += 1.0
                held = depth < len(record.accepted)
                self.held[b] += held
                self.held_top[b] += held and best_child.get(node) == path[depth + 1]
        s = self.strength
        self.follow_table = [(hit + s * prior) / (n + s) for hit, n, prior in zip(self.held, self.seen, self.prior)]
        self.top_follow_table = [(hit + s * prior) / (n + s)
                                 for hit, n, prior in zip(self.held_top, self.seen, self.top_prior)]

    def chain_tokens(self, forwards: int, last: int | None = None, top: bool = False) -> list[float]:
        """[forwards + 1] expected committed tokens of a chain of 0 .. forwards draft forwards, averaged over
        the last ``window`` positions (the last ``last`` ones, if given and not 0) as starting points (past the
        window's end, its mean follow); [] when empty. Each forward holds the next token with the tree's follow(q)
        (a tree of the steps' own shape), or with ``top`` the draft's top-1 follow (a chain of one-node forwards)."""
        recent = list(self.recent)[-(last or self.window):]
        follows = [self.follow(q, top) for q in recent]
        if not follows:
            return []
        mean = sum(follows) / len(follows)
        totals = [0.0] * (forwards + 1)
        for start in range(len(follows)):
            survive, tokens = 1.0, 1.0
            totals[0] += 1.0
            for j in range(1, forwards + 1):
                i = start + j - 1
                survive *= follows[i] if i < len(follows) else mean
                tokens += survive
                totals[j] += tokens
        return [t / len(follows) for t in totals]


# ---------------------------------------------------------------------------------------------- controller
class _Sample:
    """One drafted step, as the candidates it informs see it."""

    __slots__ = ("index", "widths", "outcomes", "stamp", "cumulative_draft", "weight", "scale")

    def __init__(self, index: int, widths: tuple[int, ...], outcomes: list[tuple[int, int, int]]) -> None:
        self.index = index  # step number
        self.widths = widths  # [F] forward widths
        self.outcomes = outcomes  # per informed candidate, ascending: (committed tokens, tree size, forwards)
        self.stamp = -1  # controller version the two caches below belong to
        self.cumulative_draft: list[float] = []  # [F + 1] draft seconds of the first j forwards
        self.weight = 0.0
        self.scale = 1.0  # product of the carried_weight caps of the sequences it was carried into


class BudgetController:
    """Chooses every step's tree budget from measured costs and counterfactual acceptance (module
    docstring). One instance serves one generation; feed it every verified step in order."""

    def __init__(self, settings: ControllerSettings = ControllerSettings(), prior: CostPrior | None = None) -> None:
        if not isinstance(settings, ControllerSettings):
            raise bad_argument("settings", settings, "a ControllerSettings")
        if prior is not None and not isinstance(prior, CostPrior):
            raise bad_argument("prior", prior, "a CostPrior or None")
        self.settings = settings
        self.candidates = settings.candidates()  # ascending budgets
        self._index_of = {k: i for i, k in enumerate(self.candidates)}
        prior = prior or CostPrior({}, {})
        refresh = settings.cost_refresh_interval  # design 21: verify samples older than 2 intervals leave the fit
        self.verify_cost = CostCurve(settings.cost_samples, prior.verify_seconds,  # by tree size
                                     horizon=2 * refresh if refresh > 0 else None,
                                     paired=1 if settings.paired_plain else None)  # design 42
        self.draft_cost = CostCurve(settings.cost_samples, prior.draft_seconds)  # by forward width
        self.overhead_cost = CostCurve(settings.cost_samples, prior.overhead_seconds)  # by draft forwards per step
        self.catch_up_cost = CostCurve(settings.cost_samples)  # by catch-up tokens (bucketed): extra first-forward seconds
        self.predictability = Predictability(settings.confidence_window, settings.calibration_decay,
                                             settings.calibration_prior_strength, settings.bet_window)
        self.calibration = Calibration(settings.calibration_edges, settings.calibration_decay,
                                       settings.calibration_prior_strength)
        self._samples = [deque(maxlen=settings.window) for _ in self.candidates]  # per candidate
        self._table_top = settings.max_budget  # the cost tables cover sizes 0..top (grown to what records show)
        self._rebuild_tables()
        self._branch_added = 0.0  # decayed nodes added by forwards after the first...
        self._branch_width = 0.0  # ... per node those forwards expanded
        self._step = 0  # steps observed
        self._version = 0  # bumped at every observe (invalidates the per-sample caches)
        self._choice = settings.initial_budget
        self._planned: int | None = None
        self._reason = "choice"  # why the planned budget (a key of REASONS)
        self._previous_plain = True  # the drafter has tokens to catch up (its prompt; a plain step's tokens)
        self._catch_up_tokens = 0  # what the loop said the drafter has to catch up, for the planned step
        self._sequence_tokens = 0  # tokens committed in this sequence
        self._sequence_confidences = 0  # target confidences reported in this sequence (design 14)
        self._tokens_left: int | None = None  # what the loop said before the planned step
        self._cut_by_limit = False  # the last step committed all the tokens that were left
        self._lengths: deque[int] = deque(maxlen=LENGTHS_KEPT)  # tokens of the last finished sequences
        self._catch_up_skips = 0  # drafted choices run as plain steps because the catch-up would not pay
        self._sequence_start = 0  # the step this sequence started at: samples before it were carried
        self._own_outcomes: list[list[tuple[int, int, int]]] = []  # this sequence's drafted steps' outcomes
        self._released_at: int | None = None  # own drafted steps after which the carried samples were released
        self._observed_seconds = 0.0  # steps' seconds, decayed (carried over)
        self._lost_seconds = 0.0  # seconds trials lost against the choice's rate (signed, decayed; carried over)
        self._exploration_keep = 0.5 ** (1.0 / settings.exploration_half_life)  # weight kept a step
        self._trial_losses: dict[int, float] = {}  # by probe budget: what its last trials lost (design 11)
        self._last_plain = 0
        self._last_refresh = 0  # the step of the last cost refresh (design 21)
        self._last_ran: dict[int, int] = {}  # budget -> steps observed when its last step was (design 21)
        self._drafted_before = True  # the previous sequence ran a drafted step (this one's: _own_outcomes)
        self._last_trial_end = 0  # the step the last trial ended at (design 12)
        self._prompt_pairs: deque[tuple[float, float]] = deque(maxlen=PRIOR_PAIRS)  # design 29, carried over
        self._agreement: float | None = None  # this sequence's prompt agreement, once the loop measured it
        self._prior: dict | None = None  # what design 29 predicted for this sequence (summary)
        self._own_drafted = [0, 0.0]  # this sequence's drafted steps: committed tokens, seconds
        self._own_catch_up = 0.0  # ... of those seconds, the drafter's catch-up (design 46)
        self._early_plain: float | None = None  # a kept early check's plain seconds, judged again later (design 51)
        self._plain_checks = Counter()  # design 46: checks by outcome ("kept", "plain")
        self._sequences = 0  # sequences before this one (for_next_sequence)
        self._sample_every = PRIOR_SAMPLE_EVERY  # sequences between two prompt samples (designs 32, 35)
        self._sample_base = 0  # the sequence number of the last prompt sample: one is due every _sample_every after
        self._reset_schedule()
        self._rates: dict[int, float] = {}
        self._histogram: Counter = Counter()
        self._reasons: Counter = Counter()  # planned steps by reason (REASONS)
        self._probes = Counter()
        self._growth_checks = 0
        self._early_stops = 0

    def for_next_sequence(self) -> "BudgetController":
        """A copy of this controller to run the next generation with (this one is left unchanged).

        What was learned carries over: the cost curves, the acceptance samples (their ages go on
        counting, so they fade with ``half_life`` as the new sequence brings its own), the calibration,
        the current choice and the probe schedule. Improvement over starting each call afresh: requests
        are short (a QA answer is 5-20 verify steps), and a fresh controller spends its first steps
        trusting an initial budget and probing twice that, which on such requests is a fifth or more of
        all steps (docs/BENCHMARKS.md section 5). What belongs to one sequence is reset: the planned
        budget and the drafter's catch-up flag (a new sequence's drafter starts with its prompt to
        forward). The carried acceptance samples are scaled so that none weighs more than
        ``carried_weight`` steps in all (design 7); the finished sequence's length joins the lengths that
        estimate a request's tokens left (design 6). Tried and left out: resetting the probe schedule per
        request (short requests on hostile costs then probe in every request: 0.91 of plain against 0.95
        carried, in tests/test_control.py's world), and ageing the carried samples by a fixed gap of
        16-32 steps (0.87-0.88 of the best fixed N on a synthetic code -> chat switch against 0.89):
        a gap halves 32 samples to 16 steps' worth, still more than a short request's own steps."""
        follower = copy.deepcopy(self)
        speed = self._drafted_speed()
        if speed is not None:  # design 29: what a prompt agreeing this much drafted at, on this machine
            follower._prompt_pairs.append((self._agreement, speed))
        if self._agreement is not None:  # design 35: samples are counted from this one, the interval doubled on a clear win
            follower._sample_base = self._sequences
            won = speed is not None and speed >= NEW_COMMAND_MARGIN
            follower._sample_every = (min(2 * self._sample_every, PRIOR_SAMPLE_MAX) if won
                                      else self._sample_every if speed is None else PRIOR_SAMPLE_EVERY)
        follower._agreement, follower._prior, follower._own_drafted = None, None, [0, 0.0]
        follower._own_catch_up, follower._early_plain = 0.0, None
        follower._sequences += 1
        follower._planned = None
        follower._previous_plain = True  # the new sequence's drafter starts with its prompt to forward
        if follower._sequence_tokens > 0:  # a sequence cut by its token limit would have gone on: length unknown
            follower._lengths.append(math.inf if follower._cut_by_limit else follower._sequence_tokens)
        follower._sequence_tokens = 0
        follower._sequence_confidences = 0
        follower._sequence_start = follower._step
        follower._drafted_before = bool(self._own_outcomes)
        follower._own_outcomes = []
        follower._released_at = None
        follower._cap_carried_weight(follower.settings.carried_weight)
        follower._catch_up_skips = 0
        if follower._trial_left > 0:  # a trial cut by the end of its sequence is judged on the steps it ran:
            follower._trial_left = 0  # its next step would be the new sequence's first, which pays the
            follower._finish_trial()  # drafter's catch-up over a new prompt (design 14)
        follower._histogram = Counter()
        follower._reasons = Counter()
        follower._probes = Counter()
        follower._plain_checks = Counter()
        follower._growth_checks = follower._early_stops = 0
        return follower

    def for_new_command(self) -> "BudgetController":
        """A copy of this controller for a new command's generations (design 27; this one is left unchanged):
        the same, unless plain decoding is allowed and the carried best drafted rate beats plain decoding's by
        less than :data:`NEW_COMMAND_MARGIN`; then the acceptance samples and the last text's confidences are
        dropped, the choice is plain decoding and the probe schedule starts over, while the measured costs and
        what predicts acceptance from a text's confidences stay. Call :meth:`for_next_sequence` on the result as
        for any carried controller."""
        follower = copy.deepcopy(self)
        rates = self.rates()
        plain = rates.get(1)
        drafted = max((rate for budget, rate in rates.items() if budget > 1), default=0.0)
        if not self.settings.allow_plain or plain is None or drafted >= NEW_COMMAND_MARGIN * plain:
            return follower
        follower._samples = [deque(maxlen=self.settings.window) for _ in self.candidates]
        follower.predictability.recent.clear()  # the last command's text: design 12 predicts from the new one's
        follower._choice = 1
        follower._rates = {1: plain}
        follower._reset_schedule()
        follower._version += 1
        return follower

    def _reset_schedule(self) -> None:
        """The probe schedule as at the start: no trial or lean running, the first trial ``min_probe_interval``
        steps from now, from the first probe level (``__init__``; design 27's new command)."""
        self._trial_budget: int | None = None
        self._trial_left = 0
        self._trial_reference: float | None = None  # the choice's rate when the running trial started
        self._lean_reference: float | None = None  # the choice's rate when leaning to an untrusted rung (design 17)
        self._trial_loss = 0.0  # seconds the running trial lost so far against that rate, its catch-up left out
        self._probe_level = 0  # trials since the last win, modulo probe_levels
        self._interval = self.settings.min_probe_interval
        self._next_trial = self._step + self.settings.min_probe_interval

    @property
    def choice(self) -> int:
        """The budget currently preferred (what runs outside trials, lean steps one rung above it (design 17),
        plain-step refreshes and catch-up skips)."""
        return self._choice

    # ------------------------------------------------------------------ the loop's three calls
    def next_budget(self, catch_up_tokens: int = 0, tokens_left: int | None = None,
                    context_tokens: int | None = None) -> int:
        """The budget N of the coming step (asking twice before the step is observed gives the same N).

        ``catch_up_tokens``: committed tokens the drafter must forward before it drafts, because steps
        ran without drafting (:attr:`talon_sd.drafters.Drafter.catch_up_tokens`: the prompt, then plain
        steps' tokens); ``tokens_left``: at most this many tokens are still to come (None: unknown).
        With both, a drafted step pays the catch-up only when it is worth it (design 6).
        ``context_tokens``: the tokens in the target's cache the step's tree will attend to; verify costs are
        read at that context (design 33; None: as measured)."""
        if self._planned is not None:
            return self._planned
        if not _is_int(catch_up_tokens) or catch_up_tokens < 0:
            raise bad_argument("catch_up_tokens", catch_up_tokens, "an integer >= 0")
        if tokens_left is not None and (not _is_int(tokens_left) or tokens_left < 0):
            raise bad_argument("tokens_left", tokens_left, "an integer >= 0 or None")
        if context_tokens is not None and (not _is_int(context_tokens) or context_tokens < 0):
            raise bad_argument("context_tokens", context_tokens, "an integer >= 0 or None")
        self._read_verify_at(context_tokens)  # design 33: the costs of this context
        self._catch_up_tokens, self._tokens_left = catch_up_tokens, tokens_left
        catch_up, expected = self._catch_up_seconds(catch_up_tokens), self._expected_tokens_left(tokens_left)
        if self._trial_left > 0:
            budget, self._reason = self._trial_budget, "trial"
        else:
            self._choose()
            budget, self._reason = self._choice, "choice"
            check = self._plain_check_due()
            plain_due = check or self._plain_due()
            # design 24: a sequence about to end cannot use what exploring would learn
            short = expected is not None and expected < self.settings.explore_min_tokens
            refresh = None if plain_due or short else self._refresh_due()
            if refresh is not None and not self._worth_catching_up(refresh, catch_up, expected):
                refresh = None
            lean = None if plain_due or short or refresh is not None else self._lean()
            # a lean needs the choice and the rung to pass the catch-up test (an untrusted rung passes it: no rate);
            # otherwise the choice's own test decides below (designs 6, 14)
            if lean is not None and not all(self._worth_catching_up(k, catch_up, expected) for k in (budget, lean)):
                lean = None
            if plain_due:
                budget, self._reason = 1, "plain-check" if check else "plain-measure"
            elif refresh is not None:
                budget, self._reason = refresh, "cost-refresh"
                self._last_refresh = self._step
            elif lean is not None:
                budget, self._reason = lean, "lean"
                # an untrusted rung is explored: its losses count against the exploration share (design 8)
                self._lean_reference = None if lean in self._rates else self._rates[self._choice]
                self._next_trial = max(self._next_trial, self._step + self._interval)  # the lean is the probe
            else:
                if (self._step >= self._next_trial or self._predicted_win()) and budget < self.candidates[-1]:
                    blocked = "trial-short" if short else self._trial_blocked(catch_up, expected)
                    if blocked is None:
                        budget = self._start_trial(catch_up, expected)  # sets the reason
                    else:
                        self._reason = blocked
                if self._trial_left == 0 and budget > 1 and not self._worth_catching_up(budget, catch_up, expected):
                    budget, self._reason = 1, "catch-up-skip"
                    self._catch_up_skips += 1
        self._planned = budget
        self._histogram[budget] += 1
        self._reasons[self._reason] += 1
        return budget

    def _read_verify_at(self, context_tokens: int | None) -> None:
        """Read the verify curve at ``context_tokens`` (design 33; None: leave it where it is read)."""
        if self.verify_cost.read_at(context_tokens):
            self.verify_cost.refit()
            self._rebuild_tables()
            self._version += 1

    @property
    def released_after(self) -> int | None:
        """This sequence's own drafted steps after which its carried samples were released (designs 8 and 47), or
        None."""
        return self._released_at

    @property
    def reason(self) -> str:
        """Why the planned (or last planned) step got its budget: a key of :data:`REASONS`."""
        return self._reason

    @property
    def prompt_prior(self) -> dict | None:
        """What designs 29 and 30 made of this sequence's prompt (agreement, neighbours, predicted speed, far below the
        last pair's agreement on steep verification, started plain), or None before :meth:`observe_prompt`."""
        return self._prior

    def prompt_agreement_due(self, catch_up_tokens: int = 0, tokens_left: int | None = None,
                             context_tokens: int | None = None) -> bool:
        """Whether the loop should measure this sequence's prompt agreement before its first step (design 29): the
        sequence has run no step, the prior is on (``prompt_prior_width`` > 0, plain decoding allowed), and the
        first step would draft (:meth:`next_budget` with the same arguments, asked of a copy: this controller is
        left as it was). A plain first step has nothing to be spared, and the draft's prompt forward, which the
        measurement runs at once, is then one the first step would have run anyway. ``context_tokens``: the
        target's cache at the first step (the prompt but its last token), where its verify costs are read (design
        34; None: where the last step read them)."""
        if (self._sequence_tokens or self._agreement is not None or not self.settings.allow_plain
                or self.settings.prompt_prior_width <= 0 or self._planned is not None):
            return False
        ahead = copy.deepcopy(self)
        ahead._read_verify_at(context_tokens)
        if not ahead._prior_can_start_plain() and (self._sequences - self._sample_base) % self._sample_every:
            return False  # no agreement could change this start (design 32): only a sample of the prompts pays (35)
        return ahead.next_budget(catch_up_tokens, tokens_left, context_tokens) > 1

    def _prior_can_start_plain(self) -> bool:
        """Whether some agreement could make :meth:`observe_prompt` start this sequence plain (design 32): the earlier
        measured prompts near some agreement drafted, on average, slower than plain decoding (design 29), or one taught
        the prior and verifying the first step's tree costs at least :data:`FAR_VERIFY_RATIO` plain verifies (design
        30)."""
        if self._a_near_set_loses():
            return True
        if self.settings.prompt_gap <= 0 or not self.verify_cost.has(1):
            return False
        tree_size = max(self._choice, self.settings.plain_probe_budget)
        return self._verify(tree_size) >= FAR_VERIFY_RATIO * self._verify(1)

    def observe_prompt(self, agreement: float, context_tokens: int | None = None) -> None:
        """The prompt's draft/target agreement in [0, 1] (designs 29, 30; the loop's measure since design 44: the
        draft's mean probability of the target's argmax over the prompt positions it compares). When the
        earlier sequences whose agreement lies within ``prompt_prior_width`` of it (at least
        :data:`PRIOR_NEIGHBOURS`) drafted, on average, slower than plain decoding on this machine, the carried
        acceptance samples are dropped and the choice is plain decoding: the sequence then drafts only once its own
        text shows it pays (trials from plain, design 12). The same when too few earlier prompts are near and none of
        them drafted as fast as plain, the agreement lies more than ``prompt_gap`` below the last pair's (the
        sequence whose samples are carried) and verifying the first step's tree costs at least :data:`FAR_VERIFY_RATIO`
        plain verifies (design 30), read at ``context_tokens`` (the target's cache at the first step, design 34; None:
        where the last step read them). Call before the sequence's first step."""
        if not _is_number(agreement) or not 0 <= agreement <= 1:
            raise bad_argument("agreement", agreement, "a number in [0, 1]")
        if context_tokens is not None and (not _is_int(context_tokens) or context_tokens < 0):
            raise bad_argument("context_tokens", context_tokens, "an integer >= 0 or None")
        if self._sequence_tokens:
            raise TalonError("observe_prompt: the sequence has already run steps (call it before the first)")
        self._read_verify_at(context_tokens)
        self._agreement = float(agreement)
        width = self.settings.prompt_prior_width
        near = [speed for other, speed in self._prompt_pairs if abs(other - agreement) <= width]
        predicted = sum(near) / len(near) if len(near) >= PRIOR_NEIGHBOURS else None
        gap = self.settings.prompt_gap
        last_agreement = self._prompt_pairs[-1][0] if self._prompt_pairs else None
        plain_verify = self._verify(1) if self.verify_cost.has(1) else 0.0
        tree_size = max(self._choice, self.settings.plain_probe_budget)  # the first step's tree, or about a probe's
        far = (predicted is None and all(speed < 1.0 for speed in near) and last_agreement is not None and gap > 0
               and last_agreement - agreement > gap
               and plain_verify > 0 and self._verify(tree_size) >= FAR_VERIFY_RATIO * plain_verify)
        start_plain = (far or (predicted is not None and predicted < 1.0)) and self.settings.allow_plain and width > 0
        self._prior = {"agreement": round(self._agreement, 4), "neighbours": len(near),
                       "predicted_speed": None if predicted is None else round(predicted, 4),
                       "far_below": far and start_plain, "started_plain": start_plain}
        if start_plain:
            self._drop_to_plain()  # all samples carried: the sequence has none of its own yet
            self.predictability.recent.clear()  # the last text's confidences: design 12 predicts from this one's
            if far:
                self._lengths.clear()  # design 30: how long the other text's answers ran says nothing of this one's
            self._next_trial = max(self._next_trial, self._step + self._interval)  # no scheduled probe at once
            self._planned = None

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """The drafter forwarded ``tokens`` committed tokens outside any step, in ``seconds``: a sample of the catch-up
        curve (design 6), as a step's first forward gives one. The loop reports the draft's prompt forward that
        measuring a prompt's agreement runs (design 29), which leaves the first drafted step nothing to catch up;
        without it a run whose every prompt is measured never learns what a catch-up costs, and a catch-up never
        measured costs nothing (design 38)."""
        _check_int("tokens", tokens, 0, "an integer >= 0")
        _check_number("seconds", seconds, "a finite number >= 0", lambda x: x >= 0)
        if tokens == 0:
            return
        self._add_catch_up(tokens, float(seconds))
        self.catch_up_cost.refit()
        self._planned = None

    def _add_catch_up(self, tokens: int, seconds: float) -> None:
        """One catch-up sample: ``seconds`` for ``tokens`` > 0, scaled to their bucket (refit by the caller)."""
        bucket = _bucket(tokens)
        self.catch_up_cost.add(bucket, seconds * bucket / tokens)

    def _a_near_set_loses(self) -> bool:
        """Whether some agreement in [0, 1] has at least :data:`PRIOR_NEIGHBOURS` earlier prompts within
        ``prompt_prior_width`` that drafted, on average, slower than plain decoding (design 29 would start it plain;
        design 32). The near set changes only where an agreement crosses a pair's edge (its agreement +- the width),
        so those edges and the midpoints between them near a losing pair are the agreements to try."""
        width, pairs = self.settings.prompt_prior_width, self._prompt_pairs
        losing = [other for other, speed in pairs if speed < 1]
        if not losing:
            return False
        edges = sorted({edge for other, _ in pairs for edge in (other - width, other + width)})
        tries = set(edges) | {(left + right) / 2 for left, right in zip(edges, edges[1:])}
        for agreement in tries:
            if not 0 <= agreement <= 1 or all(abs(other - agreement) > width for other in losing):
                continue
            near = [speed for other, speed in pairs if abs(other - agreement) <= width]
            if len(near) >= PRIOR_NEIGHBOURS and sum(near) < len(near):
                return True
        return False

    def _drafted_speed(self) -> float | None:
        """This sequence's drafted steps' tokens per second over plain decoding's modelled rate, when its prompt
        agreement is known and they committed at least :data:`PRIOR_MIN_TOKENS` (design 29); else None."""
        tokens, seconds = self._own_drafted
        plain = self._plain_rate()
        if self._agreement is None or tokens < PRIOR_MIN_TOKENS or seconds <= 0 or not plain:
            return None
        return tokens / seconds / plain

    def keep_growing(self, tree_log_p: Sequence[float], frontier: Sequence[int], widths_so_far: Sequence[int],
                     budget: int) -> bool:
        """Whether to run the next draft forward (design 4). ``tree_log_p`` [size] cumulative draft log p of
        the partial tree (index order, root first), ``frontier`` [F'] the indices the forward would
        expand, ``widths_so_far`` [F] the widths of this step's forwards so far, ``budget`` the step's N."""
        self._growth_checks += 1
        if not self.settings.early_stop or self.calibration.steps == 0 or not self.draft_cost.xs:
            return True
        if not frontier:
            return False
        size = len(tree_log_p)
        calibration = self.calibration
        accept, child, bin_of = calibration.accept, calibration.child, calibration.bin
        nodes = tree_log_p[1:]
        if size > budget:  # a reranking builder (EAGLE) keeps the best budget - 1
            nodes = sorted(nodes, reverse=True)[: max(budget - 1, 0)]
        expected_accepted = sum(accept[bin_of(p)] for p in nodes)
        expected_gain = sum(child[bin_of(tree_log_p[v])] for v in frontier)
        if self._branch_width > 0:
            branching = self._branch_added / self._branch_width
        else:
            branching = (size - 1) / max(1, sum(widths_so_far))
        next_width = max(1, round(branching * len(frontier)))
        forwards = len(widths_so_far)
        draft_now = sum(self._draft(width) for width in widths_so_far)
        time_now = self._overhead(forwards) + draft_now + self._verify(min(size, budget))
        time_next = (self._overhead(forwards + 1) + draft_now + self._draft(len(frontier))
                     + self._verify(min(budget, size + next_width)))
        if time_next <= 0:
            return True
        grow = (expected_accepted + expected_gain + 1.0) * time_now > (expected_accepted + 1.0) * time_next
        self._early_stops += not grow
        return grow

    def observe(self, record: StepRecord) -> None:
        """Learn from one verified step: its costs, its counterfactual outcomes, the calibration."""
        if not isinstance(record, StepRecord):
            raise TypeError(f"observe() takes a StepRecord, got {type(record).__name__}")
        forwards = len(record.forward_widths)
        # 1. costs
        self.verify_cost.add(record.size, record.verify_seconds, record.context_tokens)
        self.overhead_cost.add(forwards, record.other_seconds)
        apart = record.catch_up_seconds  # design 23: a catch-up timed apart leaves the first forward clean
        catching_up = (self._previous_plain or self._catch_up_tokens > 0) and apart is None
        for j, (width, seconds) in enumerate(zip(record.forward_widths, record.draft_seconds)):
            if j > 0 or not catching_up:  # the first forward after a plain step also catches up
                self.draft_cost.add(width, seconds)
        if forwards > 0 and self._catch_up_tokens > 0:  # what the catch-up cost on top of that forward
            if apart is None:
                self.draft_cost.refit()
                extra = max(record.draft_seconds[0] - self.draft_cost(record.forward_widths[0]), 0.0)
            else:
                extra = apart
            self._add_catch_up(self._catch_up_tokens, extra)
            self._own_catch_up += extra
        for curve in (self.verify_cost, self.draft_cost, self.overhead_cost, self.catch_up_cost):
            curve.refit()
        self._table_top = max(self._table_top, record.size, forwards, max(record.forward_widths, default=0))
        self._rebuild_tables()
        # 2. what every candidate budget would have done (plain steps say nothing about acceptance)
        if forwards > 0 or record.complete:
            outcomes = []
            for k in self.candidates:
                if not informs(record, k):
                    break
                outcome = prefix_outcome(record, k)
                outcomes.append((outcome.accepted + 1, outcome.tree_size, outcome.forwards))
            sample = _Sample(self._step, record.forward_widths, outcomes)
            for i in range(len(outcomes)):
                if self.candidates[i] > 1:
                    self._samples[i].append(sample)
            if forwards > 0:
                self._own_outcomes.append(outcomes)
                self._release_if_changed()
        self.predictability.observe(record)
        self._sequence_confidences += len(record.confidence)
        if forwards > 0:
            self.calibration.observe(record)
            decay = self.settings.calibration_decay
            self._branch_added = decay * self._branch_added + record.size - record.prefix_after_forward[0]
            self._branch_width = decay * self._branch_width + sum(record.forward_widths[1:])
        # 3. bookkeeping
        seconds = sum(record.draft_seconds) + (apart or 0.0) + record.verify_seconds + record.other_seconds
        if forwards > 0:
            self._own_drafted[0] += len(record.accepted) + 1
            self._own_drafted[1] += seconds
            if self._early_plain is not None and len(self._own_outcomes) >= self.settings.plain_check_steps:
                plain, self._early_plain = self._early_plain, None  # design 51: design 46's judgement, on that step
                if self._choice != 1:
                    self._judge_plain_check(plain)
        keep = self._exploration_keep
        self._observed_seconds = keep * self._observed_seconds + seconds
        self._lost_seconds *= keep
        if self._trial_left > 0 and self._trial_reference:  # what the trial step cost against the choice
            lost = seconds - (len(record.accepted) + 1) / self._trial_reference
            self._lost_seconds += lost
            self._trial_loss += lost - self._catch_up_seconds(self._catch_up_tokens)
        elif self._reason == "lean" and self._lean_reference:  # an untrusted rung's step, likewise (design 17)
            self._lost_seconds += seconds - (len(record.accepted) + 1) / self._lean_reference
        if self._reason == "plain-check" and forwards == 0:
            self._judge_plain_check(seconds)
        self._previous_plain = forwards == 0
        self._catch_up_tokens = 0
        self._sequence_tokens += len(record.accepted) + 1
        self._cut_by_limit = self._tokens_left is not None and len(record.accepted) + 1 >= self._tokens_left
        if forwards == 0:
            self._last_plain = self._step
        self._step += 1
        self._last_ran[record.budget] = self._step
        self._version += 1
        self._planned = None
        if self._trial_left > 0:
            self._trial_left -= 1
            if self._trial_left == 0:
                self._finish_trial()

    # ------------------------------------------------------------------ reports
    def summary(self) -> dict:
        """Budgets chosen (mean, histogram, plain fraction), the current choice and rate estimates
        (tokens/s), probe bookkeeping, cost tables (fitted seconds) and the calibration table."""
        chosen = sum(self._histogram.values())
        return {
            "steps": self._step,
            "budget": self._choice,
            "mean_budget": round(sum(k * n for k, n in self._histogram.items()) / chosen, 3) if chosen else 0.0,
            "budget_histogram": dict(sorted(self._histogram.items())),
            "plain_fraction": round(self._histogram.get(1, 0) / chosen, 4) if chosen else 0.0,
            "reasons": dict(sorted(self._reasons.items())),
            "rates": {k: round(rate, 6) for k, rate in sorted(self._rates.items())},
            "probe_interval": self._interval,
            "probes": dict(self._probes),
            "costs": {
                "verify_seconds": self.verify_cost.points(),
                "draft_seconds": self.draft_cost.points(),
                "overhead_seconds": self.overhead_cost.points(),
            },
            "catch_up_seconds": self.catch_up_cost.points(),
            "catch_up_skips": self._catch_up_skips,
            "carried_released_after": self._released_at,
            "plain_checks": dict(self._plain_checks),
            "prompt_prior": self.prompt_prior,
            "exploration_lost_seconds": round(self._lost_seconds, 6),
            "growth_checks": self._growth_checks,
            "early_stops": self._early_stops,
            "calibration": self.calibration.rows(),
        }

    def cost_prior(self) -> CostPrior | None:
        """The fitted cost curves as a :class:`CostPrior` for the next generation (None before any step)."""
        if not self.verify_cost.samples:
            return None
        return CostPrior(self.verify_cost.points(), self.draft_cost.points(), self.overhead_cost.points())

    def estimated_seconds(self, outcome: PrefixOutcome) -> float:
        """The seconds the cost model gives a step with this outcome: overhead(forwards) + the draft
        forwards' costs + verify(tree size)."""
        return (self._overhead(outcome.forwards) + sum(self._draft(w) for w in outcome.draft_widths)
                + self._verify(outcome.tree_size))

    def rates(self) -> dict[int, float]:
        """Current trusted rate estimates (committed tokens per second) by candidate budget."""
        return self._estimate_rates()

    # ------------------------------------------------------------------ internals: costs
    def _rebuild_tables(self) -> None:
        """Dense copies of the three curves over every size a record has shown (lookups by index)."""
        top = self._table_top
        self._verify_table = self.verify_cost.table(top)  # [top + 1] by tree size
        self._draft_table = self.draft_cost.table(top)  # [top + 1] by forward width
        self._overhead_table = self.overhead_cost.table(top)  # [top + 1] by draft forwards per step

    def _verify(self, size: int) -> float:
        return self._verify_table[size] if size <= self._table_top else self.verify_cost(size)

    def _draft(self, width: int) -> float:
        return self._draft_table[width] if width <= self._table_top else self.draft_cost(width)

    def _overhead(self, forwards: int) -> float:
        return self._overhead_table[forwards] if forwards <= self._table_top else self.overhead_cost(forwards)

    def _plain_rate(self) -> float | None:
        if not self.verify_cost.has(1):
            return None
        seconds = self._overhead(0) + self._verify(1)
        return 1.0 / seconds if seconds > 0 else math.inf

    def _optimistic_rate(self, budget: int) -> float:
        """An upper bound on rate(budget). Each draft forward adds at most one layer, so a step with F
        forwards accepts at most F drafts: max over F < budget of (F + 1) / (overhead(F) + F draft(1)
        + verify(budget)) (draft(1) is the cheapest forward)."""
        if budget == 1:
            rate = self._plain_rate()
            return math.inf if rate is None else rate
        return self._best_chain_rate(budget, range(1, budget + 1))

    def _best_chain_rate(self, budget: int, tokens: Sequence[float]) -> float:
        """max over F < budget of tokens[F] / (overhead(F) + F draft(1) + verify(budget)): the best rate of a chain of
        F one-node forwards that commits tokens[F] (inf where the costs read 0)."""
        verify, draft = self._verify(budget), self._draft(1)
        best = 0.0
        for forwards in range(1, budget):
            seconds = self._overhead(forwards) + forwards * draft + verify
            if seconds <= 0:
                return math.inf
            best = max(best, tokens[forwards] / seconds)
        return best

    def _predicted_rate(self, budget: int, last: int | None = None) -> float | None:
        """rate(budget) on text like the last ``confidence_window`` committed tokens (design 12), None without
        confidences. Over the drafted steps that inform ``budget``, their weighted mean of chain_tokens(F) over
        their weighted mean seconds (F: the forwards each would have run), blended with the bound max over F <
        budget of chain_tokens(F) / (overhead(F) + F draft(1) + verify(budget)) as a prior of
        :data:`SHAPE_PRIOR_STEPS` steps (design 23): a TALON tree's shape follows the text (deep and narrow where
        the target is confident), so one old step drafted on chat, two forwards where code runs eight, is little
        evidence; alone it kept a float32 run on plain decoding through every code prompt. ``last``: replay the last
        that many confidences instead (up to ``bet_window``, design 28)."""
        tokens = self.predictability.chain_tokens(budget - 1, last)
        if not tokens:
            return None
        bound = self._best_chain_rate(budget, self.predictability.chain_tokens(budget - 1, last, top=True))
        if math.isinf(bound):
            return bound
        index, verify_table, overhead = self._index_of[budget], self._verify_table, self._overhead_table
        weight = expected = seconds = 0.0
        for sample in self._samples[index]:
            if sample.stamp != self._version:
                self._prepare(sample)
            _, size, forwards = sample.outcomes[index]
            weight += sample.weight
            expected += sample.weight * tokens[min(forwards, budget - 1)]
            seconds += sample.weight * (overhead[forwards] + sample.cumulative_draft[forwards] + verify_table[size])
        if weight <= 0 or seconds <= 0:
            return bound
        return (weight * expected / seconds + SHAPE_PRIOR_STEPS * bound) / (weight + SHAPE_PRIOR_STEPS)

    def _probe_rungs(self) -> list[int]:
        """From plain decoding, the probes of the levels up to the current one (design 3a)."""
        above, base = self.candidates[1:], self.settings.plain_probe_budget
        return [next((k for k in above if k >= base * 2 ** level), above[-1]) for level in range(self._probe_level + 1)]

    def _predicted_win(self) -> bool:
        """From plain decoding, with no trial due: True when the recent text predicts a probe rung wins by
        ``PREDICTED_WIN`` over plain decoding (design 12: a change of text is tried when it shows, not when the
        schedule says), at most once every ``min_probe_interval`` steps after the last trial, and only from a full
        ``confidence_window`` of confidences."""
        if (self._choice != 1 or not self.settings.predict_trials or len(self.candidates) < 2
                or self._step < self._last_trial_end + self.settings.min_probe_interval
                or len(self.predictability.recent) < self.settings.confidence_window):
            return False  # (design 27: a new command's first tokens are too few to predict from)
        plain = self._rates.get(1)
        if plain is None:
            return False
        return any((self._predicted_rate(k) or 0.0) > PREDICTED_WIN * plain for k in self._probe_rungs())

    def _unpredictable(self, budget: int, reference: float | None) -> bool:
        """True when even the predicted rate of ``budget`` on the recent text is below (1 - margin) x
        ``reference`` (False without a reference or confidences)."""
        predicted = self._predicted_rate(budget)
        if reference is None or predicted is None:
            return False
        return predicted < (1.0 - self.settings.dominance_margin) * reference

    def _dominated(self, budget: int, reference: float | None) -> bool:
        """True when no acceptance could make ``budget`` reach (1 - margin) x ``reference``."""
        if reference is None:
            return False
        return self._optimistic_rate(budget) < (1.0 - self.settings.dominance_margin) * reference

    # ------------------------------------------------------------------ internals: catch-up and carried samples
    def _catch_up_seconds(self, tokens: int) -> float:
        """Extra seconds the drafter's first forward takes to catch up on ``tokens`` (0 when none, or
        before any catch-up was measured: then drafting is judged as before design 6)."""
        if tokens <= 0 or not self.catch_up_cost.samples:
            return 0.0
        bucket, bottom, top = _bucket(tokens), min(self.catch_up_cost.samples), max(self.catch_up_cost.samples)
        if bucket < bottom:  # below the smallest bucket measured, in proportion to tokens (design 23): a flat curve
            seconds = self.catch_up_cost(bottom) * tokens / bottom  # charged one plain step's token as a whole prompt
        else:
            seconds = self.catch_up_cost(bucket)
            if bucket > top:  # past the largest bucket measured, at least linear in tokens (a flat curve would
                seconds = max(seconds, self.catch_up_cost(top) * bucket / top)  # charge 700 tokens as 128, design 14)
            seconds *= tokens / bucket
        # design 26: at most what the width curve says ``tokens`` more rows of a draft forward cost. The catch-up
        # curve is measured only when a catch-up is paid, and its first sample is the draft's first forward ever
        # (cold: 2-4x); the width curve is measured every drafted step
        if len(self.draft_cost.samples) >= 2 and tokens <= 4 * max(self.draft_cost.samples):  # not far past it
            rows = self.draft_cost(tokens + 1) - self.draft_cost(1)
            if rows > 0:
                seconds = min(seconds, rows)
        return seconds

    def _expected_tokens_left(self, tokens_left: int | None) -> float | None:
        """Tokens the sequence is expected to still commit: ``tokens_left`` capped by the median of what the
        last finished sequences that outlasted this one's tokens so far went on to commit (design 9: a QA
        answer ends long before max_new_tokens, and 15 tokens into a 20-token answer 5 are left; a sequence
        its token limit cut counts as endless, so a short warm-up run does not pass for a short answer; a
        sequence already longer than all of them is judged by ``tokens_left`` alone); None when unknown."""
        committed = self._sequence_tokens
        rest = [length - committed for length in self._lengths if length > committed]
        typical = _median(rest) if rest else None
        if tokens_left is None:
            return typical
        return float(tokens_left) if typical is None else min(float(tokens_left), typical)

    def _worth_catching_up(self, budget: int, catch_up: float, expected: float | None) -> bool:
        """Whether drafting at ``budget`` for the expected rest of the sequence saves more than the catch-up
        costs: expected x (1 / rate(1) - 1 / rate(budget)) > catch-up seconds. True without the numbers."""
        plain, drafted = self._plain_rate(), self._rates.get(budget)
        if catch_up <= 0 or expected is None or plain is None or drafted is None or not self.settings.allow_plain:
            return True
        large = catch_up > self.settings.trial_cost_share * expected / plain  # design 25: more than a trial may pay
        if (self.settings.predict_trials and not self._own_outcomes and self.predictability.recent
                and (large or CATCH_UP_MARGIN * catch_up > _seconds_saved(expected, plain, drafted))):
            # design 14: a catch-up that the last sequences' rate would not pay back twice over waits for the
            # target's confidence on this sequence's own text to predict the rate; design 25: so does one larger
            # than a trial's share of the rest, however well the last sequences' text drafted
            if self._sequence_confidences < OWN_CONFIDENCES:
                return False
            # design 28: the rest of the sequence is judged on all of its own text so far (up to bet_window tokens)
            own = min(self._sequence_confidences, self.settings.bet_window)
            drafted = min(drafted, self._predicted_rate(budget, own) or drafted)
            if large:  # design 28: a bet larger than a trial's share is paid only with a margin
                return self.settings.bet_margin * catch_up < _seconds_saved(expected, plain, drafted)
        return catch_up < _seconds_saved(expected, plain, drafted)

    def _trial_affordable(self, catch_up: float, expected: float | None, probe: int | None = None) -> bool:
        """A trial explores at most ``trial_cost_share`` of the expected rest's plain seconds on catch-up
        (a 700-token prompt is not forwarded through the draft LM to try a probe on a 64-token answer);
        with ``probe``, on catch-up plus what the last trials of that probe lost (design 11)."""
        plain = self._plain_rate()
        cost = catch_up + (max(self._trial_losses.get(probe, 0.0), 0.0) if probe is not None else 0.0)
        if cost <= 0 or expected is None or plain is None:
            return True
        if cost <= self.settings.trial_cost_share * expected / plain:
            return True
        # design 15: more than the share, if the sequence's own text predicts a win that pays it back twice over
        return CATCH_UP_MARGIN * cost <= self._predicted_saving(expected, plain, probe)

    def _predicted_saving(self, expected: float, plain: float, probe: int | None) -> float:
        """From plain decoding, the seconds that drafting the expected rest at ``probe`` (None: the best probe
        rung) saves over plain decoding at the rate the sequence's own target confidences predict (design
        12); 0 before ``confidence_window`` of them or when no rung is predicted to beat plain decoding."""
        window = self.settings.confidence_window
        if self._choice != 1 or not self.settings.predict_trials or self._sequence_confidences < window:
            return 0.0
        rungs = self._probe_rungs() if probe is None else [probe]
        best = max((self._predicted_rate(k, window) or 0.0 for k in rungs), default=0.0)
        return _seconds_saved(expected, plain, best) if best > plain else 0.0

    def _cap_carried_weight(self, limit: float) -> None:
        """Scale every carried acceptance sample (one from before this sequence) by one factor so that no
        candidate's carried weight exceeds ``limit`` steps: rates (ratios of sums) are unchanged until the
        new sequence's own steps arrive, which then outweigh the carried ones after a few steps (design 7)."""
        start = self._sequence_start
        heaviest = max((sum(self._age_weight(s) for s in samples if s.index < start)
                        for samples in self._samples), default=0.0)
        if heaviest <= limit:
            return
        factor = limit / heaviest
        for sample in {id(s): s for samples in self._samples for s in samples if s.index < start}.values():
            sample.scale *= factor
        self._version += 1

    def _release_if_changed(self) -> None:
        """Design 8 (change point): once ``release_steps`` of this sequence's drafted steps are in, compare
        their mean committed tokens with the carried samples' weighted mean at the largest budget all of
        them inform; if the two differ by more than ``release_ratio`` and by more than ``RELEASE_Z`` standard
        errors (the carried samples' standard deviation, floored at one token, over the square root of the
        own steps' count) the text has changed, and the carried samples are scaled down to one step's
        weight in all (they still say something of budgets this sequence has not tried). Design 47, one-sided:
        while every own step accepted nothing there (committed one token), it has changed too once q ** k <
        ``release_nothing_p``, with k the own steps and q the carried samples' weighted share of steps that accepted
        nothing there, (weight + 0.5) / (total + 1). A budget that informs fewer candidates (a trial of a smaller tree)
        narrows the budget read, for both tests alike."""
        settings = self.settings
        if self._released_at is not None or self._sequence_start == 0 or len(self._own_outcomes) < settings.release_steps:
            return
        index = min(len(outcomes) for outcomes in self._own_outcomes) - 1
        if index < 0 or self.candidates[index] < 2:
            return
        own = sum(outcomes[index][0] for outcomes in self._own_outcomes) / len(self._own_outcomes)
        start = self._sequence_start
        weight = tokens = squares = nothing = 0.0  # nothing: the weight of carried steps that accepted nothing
        for sample in self._samples[index]:
            if sample.index < start:
                w, committed = self._age_weight(sample), sample.outcomes[index][0]
                weight, tokens, squares = weight + w, tokens + w * committed, squares + w * committed * committed
                nothing += w if committed == 1 else 0.0
        if weight < 1.0:  # too little carried to disagree with
            return
        carried = tokens / weight
        standard_error = math.sqrt(max(squares / weight - carried * carried, 1.0) / len(self._own_outcomes))
        changed = (max(own / carried, carried / own) > settings.release_ratio
                   and abs(own - carried) > RELEASE_Z * standard_error)
        if not changed and own == 1.0 and carried > 1.0 and math.isfinite(settings.release_ratio):  # design 47
            share = (nothing + 0.5) / (weight + 1.0)  # the carried steps' share that accepted nothing
            changed = share ** len(self._own_outcomes) < settings.release_nothing_p
        if changed:
            self._released_at = len(self._own_outcomes)
            self._cap_carried_weight(1.0)

    def _exploration_affordable(self) -> bool:
        """Bounded regret (design 8): trials may lose at most ``exploration_share`` of the observed seconds
        against the rate of the choice they left (a trial that won gave its loss back), both weighted
        ``0.5 ** (age / exploration_half_life)`` and carried across sequences: the bound holds locally, over
        about the last ``exploration_half_life`` steps, not only over a long run."""
        return self._lost_seconds <= self.settings.exploration_share * self._observed_seconds

    # ------------------------------------------------------------------ internals: rates and choice
    def _sums(self, samples: deque, index: int, other: int) -> tuple[float, float, float, float]:
        """Weighted (tokens, seconds) of candidates ``index`` and ``other`` (<= index) over ``samples``."""
        tokens = seconds = other_tokens = other_seconds = 0.0
        verify, overhead, version = self._verify_table, self._overhead_table, self._version
        for sample in samples:
            if sample.stamp != version:
                self._prepare(sample)
            weight, draft = sample.weight, sample.cumulative_draft
            committed, size, forwards = sample.outcomes[index]
            tokens += weight * committed
            seconds += weight * (overhead[forwards] + draft[forwards] + verify[size])
            committed, size, forwards = sample.outcomes[other]
            other_tokens += weight * committed
            other_seconds += weight * (overhead[forwards] + draft[forwards] + verify[size])
        return tokens, seconds, other_tokens, other_seconds

    def _age_weight(self, sample: _Sample) -> float:
        """A sample's weight now: its carried scale times ``0.5 ** (age / half_life)`` (design 2)."""
        return sample.scale * 0.5 ** ((self._step - sample.index) / self.settings.half_life)

    def _prepare(self, sample: _Sample) -> None:
        cumulative, draft = [0.0], self._draft_table
        for width in sample.widths:
            cumulative.append(cumulative[-1] + draft[width])
        sample.cumulative_draft = cumulative
        sample.weight = self._age_weight(sample)
        sample.stamp = self._version

    def _estimate_rates(self) -> dict[int, float]:
        """Trusted rates by candidate, chained from the smallest (design 2): the smallest trusted drafted
        budget takes its own rate; each larger one, the previous one's rate times how the two compared
        on the steps that inform the larger one (every such step informs the smaller one too)."""
        rates: dict[int, float] = {}
        plain = self._plain_rate()
        if plain is not None:
            rates[1] = plain
        previous: tuple[int, float] | None = None  # (index, rate) of the last trusted drafted budget
        for index, budget in enumerate(self.candidates):
            samples = self._samples[index]
            if budget == 1 or len(samples) < self.settings.min_steps:
                continue
            tokens, seconds, previous_tokens, previous_seconds = self._sums(
                samples, index, index if previous is None else previous[0])
            if tokens <= 0 or seconds <= 0:
                continue
            rate = tokens / seconds
            if previous is not None and previous_tokens > 0 and previous_seconds > 0:
                rate = previous[1] * rate * previous_seconds / previous_tokens
            rates[budget] = rate
            previous = (index, rate)
        return rates

    def _choose(self) -> None:
        """Update the current choice: the best trusted candidate among those the anchor admits (design 19); an
        untrusted choice (the initial budget) stays until even its optimistic rate loses clearly. From plain decoding,
        a drafted candidate must beat plain decoding's rate by more than ``leave_plain_margin`` (design 28)."""
        rates = self._rates = self._estimate_rates()
        if not rates:
            return
        eligible = {k: rate for k, rate in rates.items() if self._admitted(k)}
        best = max(eligible, key=lambda k: (eligible[k], -k))
        current, before = eligible.get(self._choice), self._choice
        if current is not None:
            # a tie keeps the current choice; design 28: leaving plain decoding needs a clear win
            to_beat = current * (1.0 + self.settings.leave_plain_margin) if self._choice == 1 else current
            if eligible[best] > to_beat:
                self._choice = best
        elif self._choice in rates or self._dominated(self._choice, eligible[best]):
            self._choice = best  # a trusted choice the anchor no longer admits, or a dominated untrusted one
        if 1 < self._choice < before and self.settings.reopen_on_fall:
            # design 45: the trials that lengthened the interval probed above the old choice, on the text before the fall
            self._interval = self.settings.min_probe_interval
            self._next_trial = min(self._next_trial, self._step + self._interval)

    def _admitted(self, budget: int) -> bool:
        """Design 19: plain decoding, the anchor (``initial_budget``) and every candidate while the anchor is
        untrusted are admitted; another drafted candidate only while, below the anchor, its rate beats the anchor's
        by more than :data:`ANCHOR_GAP`, or its paired rate beats the anchor's by more than ``anchor_z`` standard errors
        (:meth:`_paired_z`)."""
        anchor, z = self.settings.initial_budget, self.settings.anchor_z
        if z <= 0 or budget in (1, anchor) or anchor == 1 or anchor not in self._rates:
            return True
        rate, anchor_rate = self._rates.get(budget, 0.0), self._rates[anchor]
        if rate < anchor_rate:
            return True  # slower than the (always admitted) anchor, never chosen: no paired test needed
        if budget < anchor and rate > (1.0 + ANCHOR_GAP) * anchor_rate and (
                len(self._samples[self._index_of[anchor]]) >= self.settings.anchor_gap_steps
                or anchor_rate <= self._rates.get(1, 0.0)):
            return True  # every step at the anchor measures it: a wrong anchor (float32: 16 nodes verify dear)
        return self._paired_z(budget, anchor) > z

    def _paired_z(self, budget: int, other: int) -> float:
        """How many standard errors ``budget``'s rate beats ``other``'s by, on the samples that inform both (those of
        the larger): rates are weighted ratios of sums, R = sum w t / sum w s, and the difference's variance is the
        delta method's with the weights as counts of steps, sum over samples of w (u_budget - u_other) ** 2 with
        u = (t - R s) / sum w s: aged samples and carried ones (capped at ``carried_weight`` steps, design 7) are
        that much less evidence. (With w squared instead, a uniform scale cancels: 32 carried samples capped at 8
        steps' worth still admitted the last dataset's 32 nodes for a whole sum request, sweep 15.)"""
        index, other_index = self._index_of[budget], self._index_of[other]
        rows = []
        tokens = seconds = other_tokens = other_seconds = 0.0
        verify, overhead, version = self._verify_table, self._overhead_table, self._version
        for sample in self._samples[max(index, other_index)]:
            if sample.stamp != version:
                self._prepare(sample)
            weight, draft = sample.weight, sample.cumulative_draft
            row = [weight]
            for at in (index, other_index):
                committed, size, forwards = sample.outcomes[at]
                row += [committed, overhead[forwards] + draft[forwards] + verify[size]]
            rows.append(row)
            tokens, seconds = tokens + weight * row[1], seconds + weight * row[2]
            other_tokens, other_seconds = other_tokens + weight * row[3], other_seconds + weight * row[4]
        if len(rows) < 2 or seconds <= 0 or other_seconds <= 0:
            return 0.0
        rate, other_rate = tokens / seconds, other_tokens / other_seconds
        variance = sum(w * ((t - rate * s) / seconds - (t_other - other_rate * s_other) / other_seconds) ** 2
                       for w, t, s, t_other, s_other in rows)
        if variance <= 0:
            return math.inf if rate > other_rate else 0.0
        return (rate - other_rate) / math.sqrt(variance)

    def _lean(self) -> int | None:
        """Design 17: the candidate one rung above a drafted choice, to run instead of it, or None. It runs while
        its trusted rate is within ``lean_margin`` of the choice's, or, untrusted, while its optimistic rate is not
        dominated and trials have not lost their exploration share; every step it runs informs the choice and
        every budget below it, paired, on the same steps."""
        choice, rates, margin = self._choice, self._rates, self.settings.lean_margin
        if margin <= 0 or choice == 1 or choice not in rates or choice == self.candidates[-1]:
            return None
        if not (self._own_outcomes or self._drafted_before):  # as for a trial (design 11b): the choice first
            return None
        above = self._lean_rung(choice)
        if above in rates:
            return above if rates[above] >= (1.0 - margin) * rates[choice] else None
        if self._dominated(above, rates[choice]) or not self._exploration_affordable():
            return None
        return above

    def _lean_rung(self, choice: int) -> int:
        """The candidate a drafted choice leans to (design 17): the next one above it, and at least
        min(``initial_budget``, :data:`LEAN_FLOOR`) (from N = 5 the next rung, 6, adds a draft forward for one
        node and loses on text where 8 wins: it would stop a climb); below ``initial_budget``, at least
        ``lean_reach`` x the choice, up to ``initial_budget`` (design 18: from 8, 16; from 4, 8)."""
        above = [k for k in self.candidates if k > choice]  # callers never pass the largest candidate
        initial = self.settings.initial_budget  # design 18: below it, at least lean_reach x the choice
        floor = min(initial, max(LEAN_FLOOR, self.settings.lean_reach * choice))
        return next((k for k in above if k >= floor), above[-1])

    def _refresh_due(self) -> int | None:
        """Design 21: the budget whose verify cost is re-measured now, or None. At most once every
        ``cost_refresh_interval`` steps: of the candidate just below a drafted choice and the choice itself,
        the one whose last step is older, once ``cost_refresh_interval`` or more steps ran after it (budgets
        never run are left to the cost curve's interpolation). Like plain-measure steps (design 13), a refresh
        is not charged to the exploration share: it is at most one step in ``cost_refresh_interval``."""
        interval, choice = self.settings.cost_refresh_interval, self._choice
        if (interval == 0 or choice == 1 or self._step - self._last_refresh < interval
                or not (self._own_outcomes or self._drafted_before)):
            return None
        below = [k for k in self.candidates if 1 < k < choice]
        since = {budget: self._step - self._last_ran[budget] for budget in below[-1:] + [choice]
                 if budget in self._last_ran}
        since = {budget: steps for budget, steps in since.items() if steps >= interval}
        return max(since, key=since.get) if since else None

    def _plain_due(self) -> bool:
        """A plain step that measures verify(1) is due: while it has fewer than ``min_steps`` measured samples
        (from step 1 on, unless a prior gives verify(1)) and every ``plain_refresh_interval`` steps
        after (design 13)."""
        settings = self.settings
        if not settings.allow_plain or self._choice == 1:
            return False
        if not self.verify_cost.has(1, samples=settings.min_steps):
            return self._step >= 1
        refresh = settings.plain_refresh_interval
        return refresh > 0 and self._step - self._last_plain >= refresh

    def _plain_check_due(self) -> bool:
        """Design 46: a plain step checks the choice now: the sequence is not the first, opened on a drafted choice and
        ran ``plain_check_steps`` drafted steps and no plain one, and the choice's tree costs :data:`CHECK_VERIFY_RATIO`
        times the fastest plain verify kept or more. Design 51: also at or after ``early_check_steps`` drafted steps
        (and before ``plain_check_steps``) while they ran more than :data:`EARLY_CHECK_SHORTFALL` below rate(1)."""
        steps, plain = self.settings.plain_check_steps, self.verify_cost.samples.get(1)
        early, own = self.settings.early_check_steps, len(self._own_outcomes)
        if (steps == 0 or not self.settings.allow_plain or self._choice == 1 or self._sequence_start == 0
                or self._last_plain >= self._sequence_start or own < min(steps, early or steps) or not plain):
            return False
        if self._verify(self._choice) < CHECK_VERIFY_RATIO * min(plain):
            return False
        if own >= steps:
            return True
        drafted, rate = self._own_drafted_rate(), self._plain_rate()  # design 51: already clearly slower than plain
        return drafted is not None and rate is not None and drafted < (1.0 - EARLY_CHECK_SHORTFALL) * rate

    def _own_drafted_rate(self) -> float | None:
        """Committed tokens per second of this sequence's own drafted steps, their catch-up left out (designs 46, 51);
        None before any drafting seconds."""
        tokens, seconds = self._own_drafted
        drafting = seconds - self._own_catch_up
        return tokens / drafting if drafting > 0 else None

    def _judge_plain_check(self, plain_seconds: float) -> None:
        """Design 46, after the check's plain step of ``plain_seconds``: where the sequence's own drafted steps (their
        catch-up left out) committed tokens more than :data:`CHECK_MARGIN` slower than it, the acceptance samples go,
        verify(1) and the plain overhead keep only this sample, and the choice is plain decoding with its schedule
        started over. An early check (design 51: fewer than ``plain_check_steps`` own drafted steps) leaves only below
        :data:`EARLY_CHECK_SHORTFALL`, and when it keeps drafting its plain seconds judge the drafted steps again, with
        :data:`CHECK_MARGIN`, once there are ``plain_check_steps`` of them (no second plain step)."""
        drafted = self._own_drafted_rate()
        early = len(self._own_outcomes) < self.settings.plain_check_steps  # design 51: fewer steps, a wider margin
        margin = EARLY_CHECK_SHORTFALL if early else CHECK_MARGIN
        if drafted is None or plain_seconds <= 0 or drafted >= (1.0 - margin) / plain_seconds:
            self._plain_checks["kept"] += 1
            if early:
                self._early_plain = plain_seconds
            return
        self._plain_checks["plain"] += 1
        self.verify_cost.keep_newest(1, 1)
        self.overhead_cost.keep_newest(0, 1)
        for curve in (self.verify_cost, self.overhead_cost):
            curve.refit()
        self._rebuild_tables()
        self._drop_to_plain()
        self._reset_schedule()
        # design 51: the check measured drafting on this text and it lost, as a trial can; design 12's predictions
        # (read from confidences that are mostly the last text's this early) wait min_probe_interval steps, as after one
        self._last_trial_end = self._step

    def _drop_to_plain(self) -> None:
        """Forget every acceptance sample and choose plain decoding (rates: plain's alone), so that trials re-measure
        drafting on the text at hand (designs 29, 30 and 46)."""
        for samples in self._samples:
            samples.clear()
        self._choice = 1
        plain = self._plain_rate()
        self._rates = {1: plain} if plain is not None else {}
        self._version += 1

    def _trial_blocked(self, catch_up: float, expected: float | None) -> str | None:
        """Why a due trial cannot start now (a key of :data:`REASONS`), or None when it may."""
        if self._choice not in self._rates:
            return "trial-untrusted"
        # a drafted choice that ran no drafted step in this sequence or the last one (catch-up skips)
        # runs itself before a trial probes above it (design 11)
        if self._choice != 1 and not (self._own_outcomes or self._drafted_before):
            return "trial-no-own-draft"
        if not self._trial_affordable(catch_up, expected):
            return "trial-catch-up"
        if not self._exploration_affordable():
            return "trial-exploration"
        return None

    def _start_trial(self, catch_up: float, expected: float | None) -> int:
        """Begin a trial at the probe budget and return it; the current choice when every probe is dominated
        (a lost trial) or when the probe's trials lost more than the rest of the sequence affords (postponed)."""
        settings, choice = self.settings, self._choice
        above = [k for k in self.candidates if k > choice]
        # from a tiny choice (2-3), twice the choice says nothing of the larger budgets left behind
        if choice > 1 and settings.lean_margin > 0:  # design 17: from a drafted choice, the lean rung
            top = self._lean_rung(choice)
        else:
            base = settings.plain_probe_budget if choice == 1 else max(settings.probe_factor * choice,
                                                                       settings.initial_budget)
            # from plain decoding each lost trial probes twice as far, then starts over (design 3a); from a
            # drafted choice always the next rungs up to base (design 10)
            target = base * 2 ** (self._probe_level if choice == 1 else 0)
            top = next((k for k in above if k >= target), above[-1])
        reference = self._rates.get(choice)
        probe = next((k for k in reversed(above) if k <= top and not self._dominated(k, reference)), None)
        if probe is None:
            self._probes["skipped"] += 1
            self._reason = "trial-dominated"
            self._lose()
            return choice
        if choice == 1 and settings.predict_trials:  # design 12: the largest level the recent text could win
            rungs = self._probe_rungs()
            probe = next((k for k in reversed(rungs) if k <= probe and not self._unpredictable(k, reference)), None)
            if probe is None:
                self._probes["unpredictable"] += 1
                self._reason = "trial-unpredictable"
                return choice
        if not self._trial_affordable(catch_up, expected, probe):
            self._probes["postponed"] += 1
            self._reason = "trial-postponed"
            return choice
        self._trial_budget, self._trial_reference, self._trial_loss = probe, reference, 0.0
        have = len(self._samples[self._index_of[probe]])
        self._trial_left = max(settings.probe_steps, settings.min_steps - have)
        self._reason = "trial"
        return probe

    def _finish_trial(self) -> None:
        before, probe = self._choice, self._trial_budget
        self._last_trial_end = self._step
        if self._trial_reference:
            last = self._trial_losses.get(probe)
            self._trial_losses[probe] = self._trial_loss if last is None else 0.5 * (last + self._trial_loss)
        self._trial_budget = None
        self._choose()
        if self._choice > before:
            self._probes["won"] += 1
            self._probe_level = 0
            self._interval = self.settings.min_probe_interval
            self._next_trial = self._step + self._interval
        else:
            self._probes["lost"] += 1
            self._lose()

    def _lose(self) -> None:
        self._probe_level = (self._probe_level + 1) % self.settings.probe_levels
        self._interval = min(2 * self._interval, self.settings.max_probe_interval)
        self._next_trial = self._step + self._interval
