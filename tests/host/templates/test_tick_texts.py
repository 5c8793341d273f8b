"""/proc/timer_list of two clones of the base template (6.1.0 Debian kernel, 1 vCPU, TCG),
each baked while the 2-core host ran 8 busy loops. BAD: the bake's clocksource watchdog had
marked the TSC unstable ("skew is too large" against refined-jiffies), the clone idled at 252
local timer interrupts/s. GOOD: TSC kept, ~13/s. Captured as read by an exec in the clone."""

BAD_CLOCKSOURCE = "refined-jiffies"
GOOD_CLOCKSOURCE = "tsc"

BAD_TIMER_LIST = """\
Timer List Version: v0.9
HRTIMER_MAX_CLOCK_BASES: 8
now at 20595743240 nsecs

cpu: 0
 clock 0:
  .base:       00000000a3dc968f
  .index:      0
  .resolution: 4000000 nsecs
  .get_time:   ktime_get
  .offset:     0 nsecs
active timers:
 #0: <00000000245834bf>, watchdog_timer_fn, S:01
 # expires at 24456281170-24456281170 nsecs [in 3860537930 to 3860537930 nsecs]
 #1: <0000000086b0dae5>, hrtimer_wakeup, S:01
 # expires at 80559740990-80559790990 nsecs [in 59963997750 to 59964047750 nsecs]
 clock 1:
  .base:       00000000ea6e60af
  .index:      1
  .resolution: 4000000 nsecs
  .get_time:   ktime_get_real
  .offset:     1796213448149871968 nsecs
active timers:
 clock 2:
  .base:       0000000051ea6130
  .index:      2
  .resolution: 4000000 nsecs
  .get_time:   ktime_get_boottime
  .offset:     0 nsecs
active timers:
 clock 3:
  .base:       00000000ba3c4955
  .index:      3
  .resolution: 4000000 nsecs
  .get_time:   ktime_get_clocktai
  .offset:     1796213448149871968 nsecs
active timers:
 clock 4:
  .base:       00000000b0de2479
  .index:      4
  .resolution: 4000000 nsecs
  .get_time:   ktime_get
  .offset:     0 nsecs
active timers:
 clock 5:
  .base:       00000000f50e24e8
  .index:      5
  .resolution: 4000000 nsecs
  .get_time:   ktime_get_real
  .offset:     1796213448149871968 nsecs
active timers:
 clock 6:
  .base:       00000000ac82f6ec
  .index:      6
  .resolution: 4000000 nsecs
  .get_time:   ktime_get_boottime
  .offset:     0 nsecs
active timers:
 clock 7:
  .base:       00000000fe3d7aa2
  .index:      7
  .resolution: 4000000 nsecs
  .get_time:   ktime_get_clocktai
  .offset:     1796213448149871968 nsecs
active timers:
  .expires_next   : 1432577653 nsecs
  .hres_active    : 0
  .nr_events      : 0
  .nr_retries     : 0
  .nr_hangs       : 0
  .max_hang_time  : 0
  .nohz_mode      : 0
  .last_tick      : 0 nsecs
  .tick_stopped   : 0
  .idle_jiffies   : 0
  .idle_calls     : 0
  .idle_sleeps    : 0
  .idle_entrytime : 20547740240 nsecs
  .idle_waketime  : 0 nsecs
  .idle_exittime  : 0 nsecs
  .idle_sleeptime : 0 nsecs
  .iowait_sleeptime: 0 nsecs
  .last_jiffies   : 0
  .next_timer     : 0
  .idle_expires   : 0 nsecs
jiffies: 4294897306

Tick Device: mode:     0
Broadcast device
Clock Event Device: <NULL>
tick_broadcast_mask: 0
tick_broadcast_oneshot_mask: 0

Tick Device: mode:     0
Per CPU device: 0
Clock Event Device: lapic
 max_delta_ns:   34360150773
 min_delta_ns:   1000
 mult:           268432234
 shift:          32
 mode:           2
 next_event:     9223372036854775807 nsecs
 set_next_event: lapic_next_event
 shutdown:       lapic_timer_shutdown
 periodic:       lapic_timer_set_periodic
 oneshot:        lapic_timer_set_oneshot
 oneshot stopped: lapic_timer_shutdown
 event_handler:  tick_handle_periodic

 retries:        0
Wakeup Device: <NULL>

"""

GOOD_TIMER_LIST = """\
Timer List Version: v0.9
HRTIMER_MAX_CLOCK_BASES: 8
now at 21381435038 nsecs

cpu: 0
 clock 0:
  .base:       000000001b7dda58
  .index:      0
  .resolution: 1 nsecs
  .get_time:   ktime_get
  .offset:     0 nsecs
active timers:
 #0: <000000000cfe44c5>, tick_sched_timer, S:01
 # expires at 21384000000-21384000000 nsecs [in 2564962 to 2564962 nsecs]
 #1: <00000000fc0d0304>, watchdog_timer_fn, S:01
 # expires at 24520706462-24520706462 nsecs [in 3139271424 to 3139271424 nsecs]
 #2: <0000000081d77c29>, hrtimer_wakeup, S:01
 # expires at 81305006865-81305056865 nsecs [in 59923571827 to 59923621827 nsecs]
 clock 1:
  .base:       000000005f05a940
  .index:      1
  .resolution: 1 nsecs
  .get_time:   ktime_get_real
  .offset:     1796213480810728452 nsecs
active timers:
 clock 2:
  .base:       00000000c5185244
  .index:      2
  .resolution: 1 nsecs
  .get_time:   ktime_get_boottime
  .offset:     0 nsecs
active timers:
 clock 3:
  .base:       00000000db83f90a
  .index:      3
  .resolution: 1 nsecs
  .get_time:   ktime_get_clocktai
  .offset:     1796213480810728452 nsecs
active timers:
 clock 4:
  .base:       0000000058871606
  .index:      4
  .resolution: 1 nsecs
  .get_time:   ktime_get
  .offset:     0 nsecs
active timers:
 clock 5:
  .base:       00000000a34dd88c
  .index:      5
  .resolution: 1 nsecs
  .get_time:   ktime_get_real
  .offset:     1796213480810728452 nsecs
active timers:
 clock 6:
  .base:       000000008b435436
  .index:      6
  .resolution: 1 nsecs
  .get_time:   ktime_get_boottime
  .offset:     0 nsecs
active timers:
 clock 7:
  .base:       0000000071a51bd4
  .index:      7
  .resolution: 1 nsecs
  .get_time:   ktime_get_clocktai
  .offset:     1796213480810728452 nsecs
active timers:
  .expires_next   : 21384000000 nsecs
  .hres_active    : 1
  .nr_events      : 1842
  .nr_retries     : 6
  .nr_hangs       : 0
  .max_hang_time  : 0
  .nohz_mode      : 2
  .last_tick      : 21252000000 nsecs
  .tick_stopped   : 0
  .idle_jiffies   : 4294897489
  .idle_calls     : 81
  .idle_sleeps    : 79
  .idle_entrytime : 21282267536 nsecs
  .idle_waketime  : 21250826720 nsecs
  .idle_exittime  : 21251067542 nsecs
  .idle_sleeptime : 11067279849 nsecs
  .iowait_sleeptime: 72611092 nsecs
  .last_jiffies   : 4294897489
  .next_timer     : 21404000000
  .idle_expires   : 21404000000 nsecs
jiffies: 4294897522

Tick Device: mode:     1
Broadcast device
Clock Event Device: <NULL>
tick_broadcast_mask: 0
tick_broadcast_oneshot_mask: 0

Tick Device: mode:     1
Per CPU device: 0
Clock Event Device: lapic
 max_delta_ns:   34357402127
 min_delta_ns:   1000
 mult:           268453709
 shift:          32
 mode:           3
 next_event:     21384000000 nsecs
 set_next_event: lapic_next_event
 shutdown:       lapic_timer_shutdown
 periodic:       lapic_timer_set_periodic
 oneshot:        lapic_timer_set_oneshot
 oneshot stopped: lapic_timer_shutdown
 event_handler:  hrtimer_interrupt

 retries:        2
Wakeup Device: <NULL>

"""
